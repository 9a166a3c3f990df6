"""Splitting outgoing text into Telegram-sized chunks on natural boundaries, keeping code fences balanced."""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Final

TELEGRAM_TEXT_LIMIT: Final = 4096
MIN_LIMIT: Final = 16

_FENCE: Final = "```"
_CLOSE: Final = "\n```"
_GAP_RE: Final = re.compile(r"[ \t\r\n]+")
# A fence line starts a line with ``` and has no further backtick (so "```code```" is inline code, not a fence).
_FENCE_RE: Final = re.compile(r"^```[^`\n]*", re.MULTILINE)

_Cut = tuple[int, int]  # (end of this chunk's text, start of the next chunk's text)


def text_length(text: str) -> int:
    """Return the length of ``text`` as Telegram counts it.

    Args:
        text: Any string.

    Returns:
        The number of UTF-16 code units: characters outside the BMP (most emoji) count 2.
    """
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def split_text(text: str, *, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` UTF-16 code units each; nothing is truncated.

    Cuts go at the last blank line that fits, else the last line break, else the last space, falling back
    to a finer boundary only when the coarser one would leave the chunk less than half full (any boundary
    still beats a hard cut inside a word). The whitespace at a cut is dropped; everything else is kept in
    order. A cut inside a ``` fence closes the chunk with a ``` line and reopens the next chunk with the
    same language tag, so every chunk of a split text has balanced fences (an unclosed fence is closed).

    Args:
        text: The message text.
        limit: Maximum chunk length in UTF-16 code units.

    Returns:
        ``[]`` for empty or whitespace-only text, ``[text]`` unchanged when it fits, else the chunks in order.

    Raises:
        ValueError: If ``limit`` is below ``MIN_LIMIT``.
    """
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}, got {limit}")
    if not text.strip():
        return []
    if text_length(text) <= limit:
        return [text]
    return _Splitter(text, limit).run()


class _Splitter:
    """One split: precomputed UTF-16 offsets, fence lines and whitespace gaps of ``text``."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit
        self.units = list(accumulate((2 if ord(ch) > 0xFFFF else 1 for ch in text), initial=0))
        self.ticks: dict[int, tuple[int, bool]] = {}  # line start -> (end of its backtick-free run, is a fence)
        self.marks: list[int] = []  # starts of fence lines
        self.states: list[str | None] = []  # language of the open fence after each fence line (None: closed)
        opener_ends, closers = self._scan_fences()
        self.gaps: list[tuple[int, int, int]] = []  # (start, resume, level: 0 space, 1 line, 2 paragraph)
        for m in _GAP_RE.finditer(text):
            start, newlines = m.start(), m.group().count("\n")
            resume = start + m.group().rfind("\n") + 1 if newlines else m.end()
            if start not in opener_ends and resume not in closers:  # never leave an empty code block
                self.gaps.append((start, resume, min(newlines, 2)))
        self.gap_starts = [gap[0] for gap in self.gaps]

    def _scan_fences(self) -> tuple[set[int], set[int]]:
        state: str | None = None
        opener_ends: set[int] = set()
        closers: set[int] = set()
        for m in _FENCE_RE.finditer(self.text):
            is_fence = not self.text.startswith("`", m.end())
            self.ticks[m.start()] = (m.end(), is_fence)
            if not is_fence:
                continue
            if state is None:
                words = m.group()[3:].split()
                state = words[0] if words else ""
                opener_ends.add(m.start() + len(m.group().rstrip()))
            else:
                state = None
                closers.add(m.start())
            self.marks.append(m.start())
            self.states.append(state)
        return opener_ends, closers

    def run(self) -> list[str]:
        chunks: list[str] = []
        pos = 0
        while pos < len(self.text):
            lang = self.open_at(pos)
            reopen = lang if lang is not None and text_length(lang) <= self.limit // 2 - 8 else ""
            prefix = "" if lang is None else f"{_FENCE}{reopen}\n"
            cut, resume = self._choose(pos, self.limit - text_length(prefix))
            body = self.text[pos:cut]
            if body.strip():
                chunks.append(prefix + body + (_CLOSE if self.open_at(cut) is not None else ""))
            pos = resume
        return chunks

    def open_at(self, p: int) -> str | None:
        """Language of the fence open just before position ``p`` ("" if untagged), None if none is open."""
        i = bisect_left(self.marks, p)
        return self.states[i - 1] if i else None

    def fits(self, pos: int, cut: int, budget: int) -> bool:
        closing = len(_CLOSE) if self.open_at(cut) is not None else 0
        return self.units[cut] - self.units[pos] + closing <= budget

    def _choose(self, pos: int, budget: int) -> _Cut:
        end = len(self.text)
        if self.fits(pos, end, budget):
            return end, end
        top = bisect_right(self.units, self.units[pos] + budget) - 1
        gap = self._best_gap(pos, top, budget)
        if gap is not None:
            return gap
        cut = self._hard_cut(pos, budget)
        return cut, cut

    def _best_gap(self, pos: int, top: int, budget: int) -> _Cut | None:
        best: list[_Cut | None] = [None, None, None]  # latest usable gap of at least each level
        lo = bisect_right(self.gap_starts, pos)
        for i in range(bisect_right(self.gap_starts, top) - 1, lo - 1, -1):
            start, resume, level = self.gaps[i]
            if not self._usable(pos, start, resume, budget):
                continue
            for lv in range(level + 1):
                best[lv] = best[lv] or (start, resume)
            if best[2] or not self._half_full(pos, start, budget):
                break
        for cut in reversed(best):
            if cut and self._half_full(pos, cut[0], budget):
                return cut
        return best[0]

    def _half_full(self, pos: int, cut: int, budget: int) -> bool:
        return 2 * (self.units[cut] - self.units[pos]) >= budget

    def _usable(self, pos: int, cut: int, resume: int, budget: int) -> bool:
        return self.fits(pos, cut, budget) and not self._starts_fake(resume) and self._end_fix(pos, cut) is None

    def _hard_cut(self, pos: int, budget: int) -> int:
        for room in (budget, budget - len(_CLOSE)):
            cut = self._settle(pos, bisect_right(self.units, self.units[pos] + room) - 1)
            if cut > pos and self.fits(pos, cut, budget):
                return cut
        raise AssertionError("unreachable: the room reserved for a closing fence always fits")  # pragma: no cover

    def _settle(self, pos: int, cut: int) -> int:
        """Move a hard cut so that neither chunk gains or loses a fence line."""
        for _ in range(4):
            fix = cut - 1 if self._starts_fake(cut) else self._end_fix(pos, cut)
            if fix is None:
                break
            cut = fix
        return cut

    def _starts_fake(self, p: int) -> bool:
        """Whether a chunk starting mid-line at ``p`` would look like it starts with a fence line."""
        text = self.text
        return p > 0 and text[p - 1] != "\n" and text.startswith(_FENCE, p) and not text.startswith("`", p + 3)

    def _end_fix(self, pos: int, cut: int) -> int | None:
        """None if the chunk's last line is a fence line exactly when the original line is, else a safer cut."""
        line = self.text.rfind("\n", max(pos - 1, 0), cut) + 1
        if line < pos or line not in self.ticks:
            return None
        end, is_fence = self.ticks[line]
        if (line + 3 <= cut <= end) == (is_fence and line < cut):
            return None
        return line if line > pos else line + 2
