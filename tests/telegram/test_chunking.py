from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from farmhost.outbox.chunking import MIN_LIMIT, TELEGRAM_TEXT_LIMIT, split_text, text_length

FENCE = "```"


def is_fence_line(line: str) -> bool:
    return line.startswith(FENCE) and "`" not in line[3:]


def fence_lines(chunk: str) -> list[str]:
    return [line for line in chunk.split("\n") if is_fence_line(line)]


def separators(original: str, chunks: list[str]) -> list[str]:
    """Whitespace before each chunk (plus the trailing rest) such that interleaving them rebuilds ``original``."""
    seps: list[str] = []
    offset = 0
    for chunk in chunks:
        start = offset
        while not original.startswith(chunk, start):
            assert start < len(original) and original[start].isspace(), f"{chunk!r} not found after {offset}"
            start += 1
        seps.append(original[offset:start])
        offset = start + len(chunk)
    seps.append(original[offset:])
    assert not seps[-1].strip()
    assert "".join(sep + chunk for sep, chunk in zip(seps, chunks, strict=False)) + seps[-1] == original
    return seps


def content_kept(original: str, chunks: list[str]) -> bool:
    """Whether the chunks, minus fence lines added at their edges, carry the original's non-whitespace in order."""
    target = "".join(original.split())

    def variants(chunk: str) -> set[str]:
        heads = {chunk}
        first, sep, rest = chunk.partition("\n")
        if sep and is_fence_line(first):
            heads.add(rest)
        bodies = set(heads)
        bodies.update(head.removesuffix("\n" + FENCE) for head in heads if head.endswith("\n" + FENCE))
        return {"".join(body.split()) for body in bodies}

    @functools.cache
    def match(i: int, offset: int) -> bool:
        if i == len(chunks):
            return offset == len(target)
        return any(target.startswith(v, offset) and match(i + 1, offset + len(v)) for v in variants(chunks[i]))

    return match(0, 0)


def check_invariants(text: str, limit: int) -> list[str]:
    chunks = split_text(text, limit=limit)
    assert split_text(text, limit=limit) == chunks
    for chunk in chunks:
        assert text_length(chunk) <= limit
        assert chunk.strip()
    if chunks != [text]:
        for chunk in chunks:
            assert len(fence_lines(chunk)) % 2 == 0, chunk
    assert content_kept(text, chunks)
    return chunks


# --- text_length -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("abc", 3), ("é", 1), ("€", 1), ("😀", 2), ("a😀b", 4), ("👍🏽", 4), ("\r\n", 2)],
)
def test_text_length_counts_utf16_code_units(text: str, expected: int) -> None:
    assert text_length(text) == expected


# --- trivial cases -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\n\n\t  \r\n"])
def test_empty_or_whitespace_only_gives_nothing_to_send(text: str) -> None:
    assert split_text(text) == []


@pytest.mark.parametrize("text", ["hi", "  padded\n\n", "a" * TELEGRAM_TEXT_LIMIT, "😀" * 2048, "```py\nunclosed"])
def test_text_within_limit_comes_back_unchanged(text: str) -> None:
    assert split_text(text) == [text]


def test_whitespace_only_over_limit_gives_nothing() -> None:
    assert split_text(" \n" * 100, limit=32) == []


@pytest.mark.parametrize("limit", [-1, 0, 1, MIN_LIMIT - 1])
def test_limit_below_minimum_is_rejected(limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        split_text("text", limit=limit)


def test_minimum_limit_is_accepted() -> None:
    assert split_text("word " * 10, limit=MIN_LIMIT) == ["word word word", "word word word", "word word word", "word "]


# --- boundary preference ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "a" * 25 + "\n\n" + "b" * 8 + "\n" + "c" * 20, ["a" * 25, "b" * 8 + "\n" + "c" * 20], id="paragraph"
        ),
        pytest.param(
            "a" * 5 + "\n\n" + "b" * 20 + "\n" + "c" * 30, ["a" * 5 + "\n\n" + "b" * 20, "c" * 30], id="line-not-tiny"
        ),
        pytest.param("x" * 5 + "\n" + "y" * 20 + " " + "z" * 30, ["x" * 5 + "\n" + "y" * 20, "z" * 30], id="space"),
        pytest.param("a" * 20 + "\n\n\n \n" + "b" * 30, ["a" * 20, "b" * 30], id="blank-lines-dropped"),
        pytest.param("a" * 30 + "\n    " + "b" * 20, ["a" * 30, "    " + "b" * 20], id="indent-kept"),
        pytest.param("a" * 100, ["a" * 40, "a" * 40, "a" * 20], id="hard-cut"),
        pytest.param("ab " + "c" * 50, ["ab", "c" * 40, "c" * 10], id="any-boundary-beats-hard-cut"),
    ],
)
def test_boundaries(text: str, expected: list[str]) -> None:
    assert split_text(text, limit=40) == expected


def test_crlf_lines_are_cut_whole() -> None:
    lines = [f"line {i:02d}" for i in range(10)]
    chunks = split_text("\r\n".join(lines), limit=32)
    assert chunks == ["\r\n".join(lines[i : i + 3]) for i in range(0, 10, 3)]


def test_prose_is_rebuilt_exactly_from_chunks_and_separators() -> None:
    paragraphs = [" ".join(f"word{p}_{w}" for w in range(40 + p)) for p in range(30)]
    text = "\n\n".join(paragraphs)
    chunks = split_text(text)
    assert len(chunks) > 1
    seps = separators(text, chunks)
    assert all(text_length(chunk) <= TELEGRAM_TEXT_LIMIT for chunk in chunks)
    assert all(sep == "\n\n" for sep in seps[1:-1])


def test_emoji_are_never_split() -> None:
    assert split_text("😀" * 40, limit=32) == ["😀" * 16, "😀" * 16, "😀" * 8]
    assert split_text("a" + "😀" * 40, limit=32) == ["a" + "😀" * 15, "😀" * 16, "😀" * 9]


def test_huge_single_word_is_cut_to_full_chunks() -> None:
    word = "x" * 10_000
    chunks = split_text(word)
    assert [len(c) for c in chunks] == [4096, 4096, 1808]
    assert "".join(chunks) == word


# --- code fences -----------------------------------------------------------------------------------------------


def test_cut_inside_fence_closes_and_reopens_with_language() -> None:
    text = "```python\n" + "\n".join(f"x = {i:03d}" for i in range(9)) + "\n```"
    assert split_text(text, limit=40) == [
        "```python\nx = 000\nx = 001\nx = 002\n```",
        "```python\nx = 003\nx = 004\nx = 005\n```",
        "```python\nx = 006\nx = 007\nx = 008\n```",
    ]


def test_untagged_fence_reopens_untagged() -> None:
    text = "```\n" + "\n".join(f"line {i}" for i in range(8)) + "\n```"
    chunks = split_text(text, limit=32)
    assert len(chunks) > 1
    assert all(c.startswith("```\n") and c.endswith("\n```") for c in chunks)


def test_cut_after_closed_fence_adds_nothing() -> None:
    block = "```sh\nls -la\n```"
    text = block + "\n\n" + "prose " * 10
    chunks = split_text(text, limit=30)
    assert chunks[0] == block
    assert FENCE not in "".join(chunks[1:])


def test_never_leaves_an_empty_code_block() -> None:
    text = "a" * 14 + "\n```py\n" + "b" * 40 + "\n```"
    assert split_text(text, limit=40) == ["a" * 14, "```py\n" + "b" * 30 + "\n```", "```py\n" + "b" * 10 + "\n```"]


def test_unclosed_fence_is_closed_in_last_chunk() -> None:
    chunks = split_text("intro\n\n```js\n" + "let a = 1;\n" * 10, limit=48)
    assert chunks[-1].endswith("\n```")
    assert all(len(fence_lines(c)) % 2 == 0 for c in chunks)


def test_overlong_language_tag_is_dropped_on_reopen() -> None:
    text = "```" + "x" * 20 + "\n" + "code line\n" * 20 + "```"
    chunks = check_invariants(text, 32)
    assert chunks[0].startswith("```" + "x" * 20)
    assert all(c.startswith("```\n") for c in chunks[2:])


def test_huge_fenced_single_line_is_hard_cut_inside_fences() -> None:
    text = "```text\n" + "y" * 100 + "\n```"
    chunks = check_invariants(text, 32)
    assert all(c.startswith("```text\n") and c.endswith("\n```") for c in chunks)


def test_inline_triple_backticks_are_not_fences() -> None:
    text = " ".join(["```x```"] * 20)
    chunks = split_text(text, limit=32)
    separators(text, chunks)


def test_mid_line_backticks_never_start_a_chunk() -> None:
    text = "x" * 20 + " ```py and more words here to pass the limit"
    chunks = check_invariants(text, 32)
    assert not any(c.startswith(FENCE) for c in chunks)
    separators(text, chunks)


def test_big_fenced_reply_at_telegram_limit() -> None:
    code = "\n".join(f"    result_{i} = compute({i}, 'value')" for i in range(400))
    text = "Here is the script:\n\n```python\ndef main():\n" + code + "\n```\n\nRun it with `python main.py`."
    chunks = check_invariants(text, TELEGRAM_TEXT_LIMIT)
    assert len(chunks) > 2
    assert all(c.count("```python\n") == 1 for c in chunks)


# --- properties ------------------------------------------------------------------------------------------------

PIECES = [
    "a",
    "word",
    "lóng",
    "😀",
    "👍🏽",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\n \n",
    "`",
    "``",
    FENCE,
    "\n```\n",
    "\n```py\n",
    "```python\n",
    "\n```c++ main\n",
    "\n```\r\n",
    "```x```",
]
piece = st.one_of(st.sampled_from(PIECES), st.text(min_size=1, max_size=60))
texts = st.lists(piece, max_size=120).map("".join)
fence_free = st.lists(
    st.one_of(st.sampled_from([p for p in PIECES if "`" not in p]), st.text(max_size=60)), max_size=120
)
limits = st.integers(min_value=MIN_LIMIT, max_value=120)


@settings(max_examples=400, deadline=None)
@given(text=texts, limit=limits)
def test_property_limits_fences_and_content(text: str, limit: int) -> None:
    check_invariants(text, limit)


@settings(max_examples=300, deadline=None)
@given(parts=fence_free, limit=limits)
def test_property_fence_free_text_is_rebuilt_exactly(parts: list[str], limit: int) -> None:
    text = "".join(parts).replace("`", "'")
    chunks = check_invariants(text, limit)
    separators(text, chunks)


@settings(max_examples=200, deadline=None)
@given(body=st.text(min_size=1, max_size=400), lang=st.sampled_from(["", "py", "rust"]), limit=limits)
def test_property_fenced_block(body: str, lang: str, limit: int) -> None:
    check_invariants(f"intro\n```{lang}\n{body}\n```\noutro", limit)


@settings(max_examples=100, deadline=None)
@given(words=st.lists(st.text(alphabet="ab😀", min_size=1, max_size=300), min_size=1, max_size=10))
def test_property_long_words_with_emoji(words: list[str]) -> None:
    text = " ".join(words)
    separators(text, check_invariants(text, 32))
