"""Agent text -> Telegram HTML: the markdown agents write becomes tags, everything else is escaped.

The output only ever contains `<b> <i> <s> <code> <pre> <a href>` and the entities `&lt; &gt; &amp; &quot;`,
and every tag is closed in the order it was opened, whatever the input: each construct is rendered from a
bounded slice of the text, so an unmatched marker stays literal text instead of opening a tag. Nesting follows
the Bot API's rules: code never sits inside another entity, links never inside links.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

from telegram.constants import ParseMode

from farmhost.outbox.chunking import TELEGRAM_TEXT_LIMIT, text_length

TELEGRAM_CAPTION_LIMIT: Final = 1024
# Deeper nesting than this is not something an agent means; past it markers stay literal (and recursion bounded).
MAX_DEPTH: Final = 12

_HEADING_RE: Final = re.compile(r"#{1,6}[ \t]+(\S.*?)(?:[ \t]+#+)?[ \t]*")
_LANG_RE: Final = re.compile(r"[A-Za-z0-9_+.-]{1,32}")
_LINK_RE: Final = re.compile(r"\[([^\[\]\n]+)\]\(((?:https?://[A-Za-z0-9.-]+(?::\d{1,5})?|tg://[a-z]+)[^\s()<>\"`]*)\)")
# Delimiter runs that mean something: ** bold, ~~ strike, * or _ italic. Any other run length is literal.
_TAG_RE: Final = re.compile(r"<[^<>]*>")  # to_html never puts '<' or '>' inside a tag (they are escaped)
_TAGS: Final = {("*", 2): "b", ("~", 2): "s", ("*", 1): "i", ("_", 1): "i"}


@dataclass(frozen=True, kw_only=True)
class Rendered:
    """What to send: the text and its parse mode (None for plain text)."""

    text: str
    parse_mode: str | None


def escape(text: str) -> str:
    """Escape text for Telegram HTML (the three characters its parser treats specially)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(text: str, *, plain: bool = False, limit: int = TELEGRAM_TEXT_LIMIT) -> Rendered:
    """Decide how one chunk goes to Telegram.

    Args:
        text: The chunk as the agent wrote it.
        plain: Send it as plain text (the fallback after Telegram refused its HTML, or the sender's choice).
        limit: Telegram's limit for this field (4096 for a message, 1024 for a caption).

    Returns:
        The HTML with `parse_mode` HTML, or the original text without a parse mode when `plain` is set or the
        text Telegram would count (after parsing the HTML) is longer than `limit`.
    """
    if plain:
        return Rendered(text=text, parse_mode=None)
    html = to_html(text)
    if text_length(visible_text(html)) > limit:
        return Rendered(text=text, parse_mode=None)
    return Rendered(text=html, parse_mode=ParseMode.HTML)


def visible_text(html: str) -> str:
    """The text Telegram shows (and counts) for HTML made by `to_html`: tags dropped, entities decoded."""
    return _TAG_RE.sub("", html).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")


def to_html(text: str) -> str:
    """Convert markdown-ish text to Telegram HTML.

    Understood: ``` fenced blocks (with a language tag), `code`, **bold**, *italic* and _italic_, ~~strike~~,
    [text](http/https/tg url), and `#` headings (bold). Everything else is escaped and kept as written.

    Args:
        text: Any text (hostile input included).

    Returns:
        HTML that Telegram's parser accepts: only known tags, all balanced.
    """
    blocks: list[str] = []
    prose: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if _is_fence(line):
            end = next((j for j in range(i + 1, len(lines)) if _is_fence(lines[j])), len(lines))
            _flush(prose, blocks)
            blocks.append(_code_block(line[3:], lines[i + 1 : end], lines[i : end + 1]))
            i = end + 1
            continue
        heading = _HEADING_RE.fullmatch(line)
        if heading:
            _flush(prose, blocks)
            blocks.append(f"<b>{_Inline(heading.group(1)).render(frozenset({'b'}))}</b>")
        else:
            prose.append(line)
        i += 1
    _flush(prose, blocks)
    return "\n".join(blocks)


def _is_fence(line: str) -> bool:
    """The chunker's rule: a line starting with ``` with no other backtick on it."""
    return line.startswith("```") and "`" not in line[3:]


def _flush(prose: list[str], blocks: list[str]) -> None:
    if prose:
        blocks.append(_Inline("\n".join(prose)).render(frozenset()))
        prose.clear()


def _code_block(info: str, body: list[str], raw: list[str]) -> str:
    content = "\n".join(body)
    if not content.strip():  # an empty <pre> is an empty entity; keep the fence lines as text
        return escape("\n".join(raw))
    words = info.split()
    lang = words[0] if words and _LANG_RE.fullmatch(words[0]) else None
    if lang is None:
        return f"<pre>{escape(content)}</pre>"
    return f'<pre><code class="language-{lang}">{escape(content)}</code></pre>'


class _Inline:
    """Inline markup of one prose block: code spans found first (they hide markers), then delimiter runs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.code: dict[int, tuple[int, int]] = {}  # start of a code span -> (end, backtick count)
        self.runs: dict[int, int] = {}  # start of a *, _ or ~ run outside code -> its length
        self.closers: dict[tuple[str, int], list[int]] = {}  # (char, length) -> starts of runs that can close
        self._scan()

    def _scan(self) -> None:
        text, n = self.text, len(self.text)
        inside_code_until = 0
        for m in re.finditer(r"`+|\*+|_+|~+", text):
            start, length = m.start(), len(m.group())
            if start < inside_code_until:
                continue
            if text[start] == "`":
                close = _find_run(text, "`", length, m.end())
                if close is not None:
                    self.code[start] = (close + length, length)
                    inside_code_until = close + length
                continue
            self.runs[start] = length
            if start > 0 and not text[start - 1].isspace():
                after = m.end()
                if text[start] != "_" or after >= n or not text[after].isalnum():
                    self.closers.setdefault((text[start], length), []).append(start)

    def _opens(self, start: int, length: int, end: int) -> bool:
        text = self.text
        after = start + length
        if after >= end or text[after].isspace():
            return False
        return text[start] != "_" or start == 0 or not text[start - 1].isalnum()

    def _closer(self, char: str, length: int, start: int, end: int) -> int | None:
        """The first run that closes an opener at `start` within the slice ending at `end`."""
        candidates = self.closers.get((char, length), [])
        k = bisect_left(candidates, start + length + 1)  # at least one character inside
        if k < len(candidates) and candidates[k] + length <= end:
            return candidates[k]
        return None

    def render(self, active: frozenset[str], start: int = 0, end: int | None = None, depth: int = 0) -> str:
        """HTML of `text[start:end]` inside the tags in `active`."""
        text = self.text
        end = len(text) if end is None else end
        out: list[str] = []
        literal = start
        i = start
        while i < end:
            piece: str | None = None
            after = i + 1
            if i in self.code:
                after, ticks = self.code[i]
                if after > end:
                    after = i + 1
                elif not active:
                    piece = f"<code>{escape(_strip_code(text[i + ticks : after - ticks]))}</code>"
            elif text[i] == "[" and "a" not in active and depth < MAX_DEPTH:
                link = _LINK_RE.match(text, i, end)
                if link:
                    after = link.end()
                    inner = self.render(active | {"a"}, link.start(1), link.end(1), depth + 1)
                    piece = f'<a href="{_attr(link.group(2))}">{inner}</a>'
            elif i in self.runs:
                length = self.runs[i]
                after = i + length
                tag = _TAGS.get((text[i], length))
                close = self._closer(text[i], length, i, end) if tag and depth < MAX_DEPTH else None
                if tag and close is not None and self._opens(i, length, end):
                    after = close + length
                    inner = self.render(active | {tag}, i + length, close, depth + 1)
                    piece = inner if tag in active else f"<{tag}>{inner}</{tag}>"
            if piece is not None:
                out.append(escape(text[literal:i]))
                out.append(piece)
                literal = after
            i = after
        out.append(escape(text[literal:end]))
        return "".join(out)


def _find_run(text: str, char: str, length: int, pos: int) -> int | None:
    """Start of the next run of exactly `length` `char`s at or after `pos`."""
    for m in re.compile(re.escape(char) + "+").finditer(text, pos):
        if len(m.group()) == length:
            return m.start()
    return None


def _strip_code(content: str) -> str:
    """Markdown drops one space on each side of a code span that has both (so `` ` `` can hold a backtick)."""
    if len(content) >= 2 and content[0] == " " and content[-1] == " " and content.strip():
        return content[1:-1]
    return content


def _attr(url: str) -> str:
    return escape(url).replace('"', "&quot;")
