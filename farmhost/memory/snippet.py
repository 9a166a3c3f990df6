"""The snippet of a hit: about 300 characters of a chunk around its line that shares most query tokens."""

from __future__ import annotations

from typing import Final

from farmhost.memory.tokenize import tokenize

SNIPPET_CHARS: Final = 300


def snippet(text: str, query_tokens: set[str], width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` starting a little before its line sharing most query tokens."""
    if len(text) <= width:
        return text.strip()  # all of it: which line matches best does not matter
    lines = text.split("\n")
    best_hits, offset, best_offset = -1, 0, 0
    for line in lines:
        hits = len(query_tokens.intersection(tokenize(line)))
        if hits > best_hits:
            best_hits, best_offset = hits, offset
        offset += len(line) + 1
    start = max(0, min(best_offset - width // 4, len(text) - width))
    piece = text[start : start + width].strip()
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")
