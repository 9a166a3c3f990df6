"""Progress log lines of a long memory (re)index: silent for the usual small refresh."""

from __future__ import annotations

import logging
import time
from typing import Final

# Logged when a refresh has more than this many files to read, or takes longer than this; then at most every
# PROGRESS_EVERY_SECONDS, and a summary at the end.
PROGRESS_FILES: Final = 200
PROGRESS_AFTER_SECONDS: Final = 1.0
PROGRESS_EVERY_SECONDS: Final = 2.0

logger = logging.getLogger("farmhost.memory.corpus")


class IndexProgress:
    """Log lines for one refresh that reads many files or takes long; silent for the usual small refresh."""

    def __init__(self, name: str, total: int, *, files: int, after: float, every: float) -> None:
        self._name, self._total, self._after, self._every = name, total, after, every
        self._started = self._last = time.monotonic()
        self._active = total > files
        if self._active:
            self._line(0)

    def step(self, done: int) -> None:
        """`done` files are read: a progress line when one is due."""
        now = time.monotonic()
        if self._active and now - self._last < self._every:
            return
        if not self._active and now - self._started < self._after:
            return
        self._active, self._last = True, now
        self._line(done)

    def finish(self, done: int, chunks: int) -> None:
        """The refresh is over: a summary line when progress was shown."""
        if not self._active:
            return
        took = time.monotonic() - self._started
        logger.info(
            "indexed memory of group %s: %s files, %s chunks in %.1f s",
            self._name,
            f"{done:,}",
            f"{chunks:,}",
            took,
            extra={
                "group": self._name,
                "event": "memory_indexed",
                "files": done,
                "chunks": chunks,
                "seconds": round(took, 3),
            },
        )

    def _line(self, done: int) -> None:
        logger.info(
            "indexing memory of group %s: %s/%s files",
            self._name,
            f"{done:,}",
            f"{self._total:,}",
            extra={"group": self._name, "event": "memory_indexing", "done": done, "files": self._total},
        )
