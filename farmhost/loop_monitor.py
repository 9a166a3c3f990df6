"""LoopMonitor: how long the event loop keeps everything waiting; stalls logged, figures in `logs/loop_lag.json`.

Everything a group waits for goes through one event loop, so a stall there is a stall for every group. The monitor
times the loop's own turns instead of waking it to find out: it wraps the loop's selector, and each time the loop
comes back to wait for I/O it records how long the turn since the last wait ran (the callbacks that ran, or a
blocking call among them) plus how far that wait overslept its deadline (a timer that fired late because the
process was not scheduled). That is the most any callback that became ready in that turn waited, so a stall of any
length is measured whole, and an idle loop is never woken for it (a 10 ms sleep measuring the same woke the daemon
100 times a second). The figures (a histogram of turns since start, the worst since start and since the last
document) are written to `logs/loop_lag.json` at most once a second and only when turns were recorded since the last
document, for `farmhost doctor`-style checks and for bench/ipc_under_attack.py. The file is a report, rewritten
often: it is not fsynced. A stall over the warning threshold is logged, at most every 10 s.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import os
import selectors
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from farmhost.files import DIR_FLAGS, write_atomic

logger = logging.getLogger(__name__)

LOOP_LAG_FILE = "loop_lag.json"
# Upper bucket edges in ms; the last bucket holds everything slower.
EDGES_MS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 2500)
_SHORT_MS = EDGES_MS[0]
_WRITE_EVERY_S = 1.0
_WARN_EVERY_S = 10.0
_monotonic = time.monotonic  # the loop's clock (`loop.time()`), looked up once: it is read twice a turn


class LoopMonitor:
    """Measures the running loop's turns."""

    def __init__(self, logs_dir: Path, *, warn_ms: float = 250.0) -> None:
        self._logs_dir = logs_dir
        self._warn_ms = warn_ms
        self.counts = [0] * (len(EDGES_MS) + 1)
        self.max_ms = 0.0
        self._interval_max_ms = 0.0
        self._worst_unwarned_ms = 0.0
        self._warned_at = float("-inf")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._selector: _TimedSelector | None = None
        self._write: asyncio.TimerHandle | None = None  # the pending write of the document, if one is due
        self._writing_turn = False  # the turn being timed is the one that wrote the document

    def start(self) -> None:
        """Start measuring the running loop's turns (a loop without a selector to time is not measured)."""
        loop = asyncio.get_running_loop()
        # asyncio offers no hook around its wait for I/O; its selector loops keep the selector here since 3.4.
        inner = getattr(loop, "_selector", None)
        if not isinstance(inner, selectors.BaseSelector):
            logger.warning("this event loop has no selector to time; the loop's lag is not measured")
            return
        self._loop, self._selector = loop, _TimedSelector(inner, self)
        loop._selector = self._selector  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Stop measuring."""
        if self._write is not None:
            self._write.cancel()
            self._write = None
        if self._selector is not None:
            self._selector.monitor = None  # it only passes calls through from now on
            if getattr(self._loop, "_selector", None) is self._selector:
                self._loop._selector = self._selector.inner  # type: ignore[union-attr]
            self._selector = None

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
        """Count one turn that kept the loop `lag_ms` from what became ready."""
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

    def _turn(self, lag_ms: float) -> None:
        # Called for every turn of a busy loop (thousands a second): the usual short turn takes the short way.
        if lag_ms <= _SHORT_MS:
            self.counts[0] += 1
            if lag_ms > self._interval_max_ms:
                self._interval_max_ms = lag_ms
                self.max_ms = max(self.max_ms, lag_ms)
        else:
            self.record(lag_ms)
        if self._write is None:
            if self._writing_turn:
                # The write's own turn is news for the next document, not a reason for one: an idle loop sleeps on.
                self._writing_turn = False
            elif self._loop is not None:
                self._write = self._loop.call_later(_WRITE_EVERY_S, self._write_document)

    def _write_document(self) -> None:
        self._write, self._writing_turn = None, True
        document = json.dumps(self.figures()).encode()
        self._interval_max_ms = 0.0
        try:
            _write_sync(self._logs_dir, document)
        except OSError as err:
            logger.debug("cannot write %s: %s", LOOP_LAG_FILE, err)


class _TimedSelector(selectors.BaseSelector):
    """The loop's selector, passed through, that tells its monitor how long each turn between two waits took."""

    def __init__(self, inner: selectors.BaseSelector, monitor: LoopMonitor) -> None:
        self.inner = inner
        self.monitor: LoopMonitor | None = monitor
        self._turn_started: float | None = None  # when the last wait returned
        self._overslept = 0.0  # how far that wait ran past its deadline

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        waits = _monotonic()
        monitor = self.monitor
        if monitor is not None and self._turn_started is not None:
            try:
                monitor._turn((self._overslept + waits - self._turn_started) * 1000)
            except Exception:  # inside the loop's own step: a fault here must cost the figures, never the loop
                logger.exception("the loop monitor failed; the loop's lag is no longer measured")
                self.monitor = None
        ready = self.inner.select(timeout)
        self._turn_started = woke = _monotonic()
        self._overslept = max(0.0, woke - waits - timeout) if timeout is not None else 0.0
        return ready

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self.inner.get_map()

    def close(self) -> None:
        self.inner.close()


def _write_sync(logs_dir: Path, document: bytes) -> None:
    fd = os.open(logs_dir, DIR_FLAGS)
    try:
        write_atomic(fd, LOOP_LAG_FILE, document, durable=False)
    finally:
        os.close(fd)
