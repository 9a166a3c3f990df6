"""Splitting a markdown file into line-addressed chunks on headings and paragraphs, with a size cap."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

# About a screenful: small enough that a hit points at one topic, big enough to hold a paragraph.
DEFAULT_MAX_CHARS: Final = 800

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A contiguous range of a markdown file's lines.

    Attributes:
        path: The file's path as given to `chunk_markdown` (relative to its memory root).
        start_line: First line, 1-based.
        end_line: Last line, 1-based and inclusive.
        text: Exactly those lines joined with newlines (CRLF line ends read as LF).
        heading: The nearest markdown heading above or at the start of the chunk, or None.
    """

    path: str
    start_line: int
    end_line: int
    text: str
    heading: str | None


def split_lines(text: str) -> list[str]:
    """The file's lines as an editor numbers them: split on LF, a trailing CR dropped, no final empty line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


@dataclass(slots=True)
class _Section:
    heading: str | None
    units: list[tuple[int, int]]  # 0-based inclusive line ranges of paragraphs (or single lines)


def _heading_text(line: str) -> str | None:
    match = _HEADING.match(line)
    if match is None:
        return None
    return (match.group(2) or "").strip()


def _sections(lines: list[str], max_chars: int) -> list[_Section]:
    """Group lines into sections (one per heading) of paragraph units; long paragraphs become line units."""
    sections = [_Section(None, [])]
    para_start: int | None = None
    in_fence = False

    def close(end: int) -> None:
        nonlocal para_start
        if para_start is None:
            return
        size = sum(len(lines[i]) + 1 for i in range(para_start, end + 1))
        if size <= max_chars:
            sections[-1].units.append((para_start, end))
        else:
            sections[-1].units.extend((i, i) for i in range(para_start, end + 1))
        para_start = None

    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _heading_text(line)
        if heading is not None:
            close(i - 1)
            sections.append(_Section(heading, [(i, i)]))
        elif not line.strip() and not in_fence:
            close(i - 1)
        elif para_start is None:
            para_start = i
    close(len(lines) - 1)
    return [s for s in sections if s.units]


def chunk_markdown(path: str, text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[Chunk]:
    """Split markdown into chunks: a new chunk at every heading, paragraphs packed up to `max_chars`.

    When a section is longer than `max_chars`, the next chunk starts with the last line of the
    previous one (a one-line overlap) so a sentence cut at the boundary is still found whole. A
    single line longer than `max_chars` is a chunk of its own. Blank lines never start or end a chunk.

    Args:
        path: Stored in each chunk as given.
        text: The file's content.
        max_chars: The size cap of a chunk, in characters (overlap and single long lines may exceed it).

    Returns:
        The chunks in file order; [] for a file with no non-blank line.
    """
    lines = split_lines(text)
    chunks: list[Chunk] = []

    def emit(start: int, end: int, heading: str | None) -> None:
        chunks.append(Chunk(path, start + 1, end + 1, "\n".join(lines[start : end + 1]), heading))

    def size(start: int, end: int) -> int:
        return sum(len(lines[i]) + 1 for i in range(start, end + 1))

    for section in _sections(lines, max_chars):
        start, end = section.units[0]
        for unit_start, unit_end in section.units[1:]:
            if size(start, unit_end) <= max_chars:
                end = unit_end
                continue
            emit(start, end, section.heading)
            # Overlap: repeat the previous chunk's last line unless that alone would break the cap.
            overlap_ok = end > start and size(end, unit_end) <= max_chars
            start, end = (end if overlap_ok else unit_start), unit_end
        emit(start, end, section.heading)
    return chunks
