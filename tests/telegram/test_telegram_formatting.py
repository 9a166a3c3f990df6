"""Agent markdown -> Telegram HTML: a table of what agents write, and properties any hostile text must keep."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from telegram_stub import parse_html

from farmhost.outbox.chunking import split_text
from farmhost.telegram.delivery.formatting import TELEGRAM_CAPTION_LIMIT, escape, render, to_html, visible_text

CASES = [
    ("plain words", "plain words"),
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("<b>not a tag</b>", "&lt;b&gt;not a tag&lt;/b&gt;"),
    ("**Pump 3** is on", "<b>Pump 3</b> is on"),
    ("*soft* and _soft_", "<i>soft</i> and <i>soft</i>"),
    ("~~gone~~", "<s>gone</s>"),
    ("run `ha <x> & y`", "run <code>ha &lt;x&gt; &amp; y</code>"),
    ("``a ` b``", "<code>a ` b</code>"),
    ("[HA](https://ha.local:8123/lovelace?a=1&b=2)", '<a href="https://ha.local:8123/lovelace?a=1&amp;b=2">HA</a>'),
    ("[me](tg://user?id=42)", '<a href="tg://user?id=42">me</a>'),
    ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
    ("[x](file:///etc/passwd)", "[x](file:///etc/passwd)"),
    ('[x](https://a.io/"onclick)', '[x](https://a.io/"onclick)'),
    ("**[docs](https://a.io)**", '<b><a href="https://a.io">docs</a></b>'),
    ("[**docs**](https://a.io)", '<a href="https://a.io"><b>docs</b></a>'),
    (
        "```python\nif a < b:\n    print('x')\n```",
        "<pre><code class=\"language-python\">if a &lt; b:\n    print('x')</code></pre>",
    ),
    ("```\nplain block\n```\nafter", "<pre>plain block</pre>\nafter"),
    ('```py"><script>\nx\n```', "<pre>x</pre>"),
    ("```sh\nunclosed **x**", '<pre><code class="language-sh">unclosed **x**</code></pre>'),
    ("```\n```", "```\n```"),
    ("# Status\nall **good**", "<b>Status</b>\nall <b>good</b>"),
    ("## **Already bold**", "<b>Already bold</b>"),
    # what must stay literal
    ("snake_case_name and __init__.py", "snake_case_name and __init__.py"),
    ("2 * 3 * 4", "2 * 3 * 4"),
    ("* item one\n* item two", "* item one\n* item two"),
    ("***both***", "***both***"),
    ("**unclosed bold", "**unclosed bold"),
    # markers never interleave: the first closer wins, the rest stays text
    ("**a *b** c*", "<b>a *b</b> c*"),
    # code inside another entity is not allowed by the Bot API: it stays as written
    ("**see `x`**", "<b>see `x`</b>"),
]


@pytest.mark.parametrize(("text", "html"), CASES)
def test_agent_markdown_becomes_telegram_html(text: str, html: str) -> None:
    assert to_html(text) == html
    parse_html(html)  # the fake Bot API's port of Telegram's parser accepts it


def test_render_uses_html_unless_told_or_too_long() -> None:
    assert render("**x**").parse_mode == "HTML" and render("**x**").text == "<b>x</b>"
    plain = render("**x** <y>", plain=True)
    assert (plain.text, plain.parse_mode) == ("**x** <y>", None)
    # Telegram counts the text after parsing: markup and escapes do not use up the limit
    full = "&" * 4000 + " **bold**"
    assert render(full).parse_mode == "HTML"
    caption = "x" * (TELEGRAM_CAPTION_LIMIT + 1)
    assert render(caption, limit=TELEGRAM_CAPTION_LIMIT).parse_mode is None


def test_every_chunk_of_a_long_reply_stays_formatted() -> None:
    reply = "\n\n".join(f"**Field {i}**: moisture *{i} %* & `sensor.f{i}`" for i in range(400))
    chunks = split_text(reply)
    assert len(chunks) > 2
    for chunk in chunks:
        rendered = render(chunk)
        assert rendered.parse_mode == "HTML"
        assert parse_html(rendered.text)[0] == visible_text(rendered.text)


_TAG = re.compile(r"<(/?)([a-z]+)[^>]*>")
_NO_CHILDREN = {"code", "pre"}


def assert_valid(html: str) -> None:
    """Telegram's parser accepts it, and nesting keeps the Bot API's rules."""
    plain, _ = parse_html(html)
    assert plain == visible_text(html)
    stack: list[str] = []
    for match in _TAG.finditer(html):
        closing, tag = match.group(1) == "/", match.group(2)
        if closing:
            assert stack and stack.pop() == tag, html
            continue
        assert tag in {"b", "i", "s", "code", "pre", "a"}, html
        parent = stack[-1] if stack else None
        assert parent is None or parent not in _NO_CHILDREN or (parent, tag) == ("pre", "code"), html
        assert tag != "a" or "a" not in stack, html
        assert tag not in _NO_CHILDREN or not stack or (parent, tag) == ("pre", "code"), html
        stack.append(tag)
    assert not stack, html


MARKDOWNISH = st.lists(
    st.sampled_from(
        [
            "a",
            "b c",
            " ",
            "\n",
            "\n\n",
            "*",
            "**",
            "_",
            "__",
            "~~",
            "~",
            "`",
            "```",
            "```py\n",
            "\n```\n",
            "[",
            "]",
            "(",
            ")",
            "](https://a.io/x_y)",
            "](tg://user?id=1)",
            "# ",
            "<",
            ">",
            "&",
            '"',
            "&amp;",
            "<b>",
            "é",
            "🌱",
        ]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(MARKDOWNISH, st.text(max_size=200)))
def test_any_text_gives_valid_html(text: str) -> None:
    assert_valid(to_html(text))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="*_~`[#\r", blacklist_categories=("Cs",)), max_size=200))
def test_text_without_markers_reads_exactly_as_written(text: str) -> None:
    html = to_html(text)
    assert parse_html(html)[0] == text
    assert html == escape(text)


def test_hostile_shapes_do_not_explode() -> None:
    for text in ("*a " * 1500, "[" * 4000, "`" * 4000, "*_" * 2000, "**" * 2000, "_a " * 1300 + "_", "~~x" * 1300):
        assert_valid(to_html(text))
