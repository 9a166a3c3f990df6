"""Tests for farmhost.memory.chunker: heading/paragraph splits, size cap, overlap, exact line ranges."""

from __future__ import annotations

import itertools

import pytest

from farmhost.memory.chunker import Chunk, chunk_markdown, split_lines

MEMORY = """Intro written before any heading.

# Fields
North field: tomatoes, drip irrigation.
South field: maize.

## Devices
switch.pump_north runs the north drip line.

```
# not a heading inside a fence

still the same block
```
# Empty section
"""


def _assert_ranges_match(text: str, chunks: list[Chunk]) -> None:
    lines = split_lines(text)
    for chunk in chunks:
        assert 1 <= chunk.start_line <= chunk.end_line <= len(lines)
        assert "\n".join(lines[chunk.start_line - 1 : chunk.end_line]) == chunk.text
        assert chunk.text.split("\n")[0].strip() and chunk.text.split("\n")[-1].strip()


def test_headings_start_chunks() -> None:
    chunks = chunk_markdown("MEMORY.md", MEMORY)
    assert [(c.start_line, c.end_line, c.heading) for c in chunks] == [
        (1, 1, None),
        (3, 5, "Fields"),
        (7, 14, "Devices"),
        (15, 15, "Empty section"),
    ]
    assert all(c.path == "MEMORY.md" for c in chunks)
    _assert_ranges_match(MEMORY, chunks)


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("\n\n   \n", 0), ("one line", 1), ("# Only a heading\n", 1), ("a\r\nb\r\n\r\nc\r\n", 1)],
)
def test_small_inputs(text: str, count: int) -> None:
    chunks = chunk_markdown("m.md", text)
    assert len(chunks) == count
    _assert_ranges_match(text, chunks)


def test_size_cap_and_one_line_overlap() -> None:
    body = "\n".join(f"Line {i}: the pump ran for {i} minutes on the north field." for i in range(60))
    text = f"# Log\n{body}\n\nA closing paragraph.\n"
    chunks = chunk_markdown("memory/log.md", text, max_chars=300)
    assert len(chunks) > 5
    _assert_ranges_match(text, chunks)
    assert all(len(c.text) <= 300 for c in chunks)
    for previous, current in itertools.pairwise(chunks):
        assert current.start_line == previous.end_line  # one line of overlap
        assert current.heading == "Log"
    assert chunks[0].start_line == 1
    assert chunks[-1].end_line == len(split_lines(text))


def test_a_single_long_line_is_its_own_chunk() -> None:
    text = "short\n" + "x" * 2000 + "\nafter\n"
    chunks = chunk_markdown("m.md", text, max_chars=100)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 1), (2, 2), (3, 3)]
    _assert_ranges_match(text, chunks)


def test_paragraphs_pack_up_to_the_cap() -> None:
    text = "para one\n\npara two\n\npara three\n"
    assert [(c.start_line, c.end_line) for c in chunk_markdown("m.md", text, max_chars=800)] == [(1, 5)]
    assert [(c.start_line, c.end_line) for c in chunk_markdown("m.md", text, max_chars=24)] == [(1, 3), (3, 5)]
    # no overlap when the overlap line plus the next paragraph would break the cap
    assert [(c.start_line, c.end_line) for c in chunk_markdown("m.md", text, max_chars=20)] == [(1, 3), (5, 5)]
