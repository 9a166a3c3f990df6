"""LoopMonitor: how late the daemon's event loop wakes, logged when it stalls and kept in `logs/loop_lag.json`.

Everything a group waits for goes through one event loop, so a stall there is a stall for every group. A task
sleeps a short interval and measures how much later it woke; the figures (a histogram since start, the worst
lag since start and in the last interval) are written off the loop every second, for `farmhost doctor`-style
checks and for bench/ipc_under_attack.py. A stall over the warning threshold is logged, at most every 10 s.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from farmhost.files import DIR_FLAGS, write_atomic

logger = logging.getLogger(__name__)

LOOP_LAG_FILE = "loop_lag.json"
# Upper bucket edges in ms; the last bucket holds everything slower.
EDGES_MS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500)
_TICK_S = 0.01
_WRITE_EVERY_S = 1.0
_WARN_EVERY_S = 10.0


class LoopMonitor:
    """Measures the running loop's wake-up lag."""

    def __init__(self, logs_dir: Path, *, warn_ms: float = 250.0) -> None:
        self._logs_dir = logs_dir
        self._warn_ms = warn_ms
        self.counts = [0] * (len(EDGES_MS) + 1)
        self.max_ms = 0.0
        self._interval_max_ms = 0.0
        self._worst_unwarned_ms = 0.0
        self._warned_at = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start measuring on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-monitor")

    async def stop(self) -> None:
        """Stop measuring."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def figures(self) -> dict[str, Any]:
        """The document `logs/loop_lag.json` holds."""
        return {
            "updatedAt": time.time(),
            "samples": sum(self.counts),
            "maxMs": round(self.max_ms, 3),
            "intervalMaxMs": round(self._interval_max_ms, 3),
            "bucketEdgesMs": list(EDGES_MS),
            "counts": list(self.counts),
        }

    def record(self, lag_ms: float) -> None:
        """Count one wake-up that came `lag_ms` late."""
        self.counts[bisect.bisect_left(EDGES_MS, lag_ms)] += 1
        self.max_ms = max(self.max_ms, lag_ms)
        self._interval_max_ms = max(self._interval_max_ms, lag_ms)
        if lag_ms >= self._warn_ms:
            self._worst_unwarned_ms = max(self._worst_unwarned_ms, lag_ms)
            now = time.monotonic()
            if now - self._warned_at >= _WARN_EVERY_S:
                logger.warning(
                    "event loop blocked for %.0f ms: every group waited that long (see logs/%s)",
                    self._worst_unwarned_ms,
                    LOOP_LAG_FILE,
                )
                self._warned_at, self._worst_unwarned_ms = now, 0.0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_write = loop.time() + _WRITE_EVERY_S
        while True:
            before = loop.time()
            await asyncio.sleep(_TICK_S)
            self.record(max(0.0, (loop.time() - before - _TICK_S) * 1000))
            if loop.time() >= next_write:
                next_write = loop.time() + _WRITE_EVERY_S
                document = json.dumps(self.figures()).encode()
                self._interval_max_ms = 0.0
                try:
                    await asyncio.to_thread(_write_sync, self._logs_dir, document)
                except OSError as err:
                    logger.debug("cannot write %s: %s", LOOP_LAG_FILE, err)


def _write_sync(logs_dir: Path, document: bytes) -> None:
    fd = os.open(logs_dir, DIR_FLAGS)
    try:
        write_atomic(fd, LOOP_LAG_FILE, document)
    finally:
        os.close(fd)
