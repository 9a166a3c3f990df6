"""FsyncBatch: result files fsync'd in one thread hop per turn of the event loop, or on the loop when alone and fast.

An fsync can take milliseconds (an SD card), so it does not run on the loop while that could hold anything up.
Each one used to take its own thread hop (`asyncio.to_thread`): a future, an executor hand-off, a wake-up of the
loop, and the interpreter lock passed back and forth around the thread's Python. Under load several groups' results
are written in the same turn of the loop; queued here, they are fsync'd by one thread call at the start of the next
turn, one after the other (on ext4 the first commits the journal for the rest).

A request answered alone (nothing else in progress: the sequential, quiet path) on a disk whose recent fsyncs were
all fast is fsync'd on the loop at once: the hop (a loop turn, two thread wake-ups, ~0.2-0.6 ms here) cost several
times the fsync itself (~0.1 ms on ext4 here), and with nothing else in progress the loop had nothing to do
meanwhile. One fsync over `INLINE_BELOW_S` (the disk got slow: an SD card, a busy journal) sends every fsync back to
the thread until `FAST_STREAK` in a row were fast again, so a slow disk stalls the loop at most once per change.
Either way each writer awaits its own file's fsync before acting on it, so what is durable when is unchanged.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass
from typing import Final

# An fsync this fast may run on the loop (when its request is alone); a slower one sends fsyncs to the thread.
INLINE_BELOW_S: Final = 0.001
# Fast fsyncs in a row (on the loop or in the thread) before one runs on the loop again.
FAST_STREAK: Final = 8


@dataclass(frozen=True, slots=True)
class _Queued:
    fd: int
    done: asyncio.Future[None]


class FsyncBatch:
    """Fsyncs and closes descriptors handed over in one turn of the loop, in one thread call (or inline, see above)."""

    def __init__(self, *, inline_below_s: float = INLINE_BELOW_S) -> None:
        """`inline_below_s`: the slowest fsync that still counts as fast (0: never on the loop)."""
        self._queued: list[_Queued] = []
        self._inline_below_s = inline_below_s
        self._fast = 0  # fsyncs in a row that took less than inline_below_s
        self._in_thread = 0  # descriptors handed to a thread call not yet returned
        self.inline = 0  # how many ran on the loop (observable by tests and benchmarks)

    async def sync_and_close(self, fd: int, *, alone: bool = False) -> None:
        """Fsync `fd`, then close it (whatever happens: the descriptor is this batch's now).

        Args:
            fd: a file just written.
            alone: nothing else is in progress that the fsync could hold up: it may run on the loop.

        Raises:
            OSError: the fsync's error (the file's content may not be on disk).
        """
        if alone and not self._queued and not self._in_thread and self._fast >= FAST_STREAK:
            self.inline += 1
            started = time.perf_counter()
            try:
                os.fsync(fd)
            except OSError:
                self._fast = 0
                raise
            else:
                self._timed(time.perf_counter() - started)
            finally:
                os.close(fd)
            return
        loop = asyncio.get_running_loop()
        queued = _Queued(fd, loop.create_future())
        self._queued.append(queued)
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        await asyncio.shield(queued.done)  # a cancelled writer's descriptor is still fsync'd and closed

    def _timed(self, seconds: float) -> None:
        self._fast = self._fast + 1 if seconds < self._inline_below_s else 0

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        try:
            work = asyncio.get_running_loop().run_in_executor(None, _sync_all, [q.fd for q in batch])
        except RuntimeError as err:  # the executor is shut down (the host is stopping)
            for queued in batch:
                os.close(queued.fd)
                queued.done.set_exception(OSError(f"fsync was not run: {err}"))
            return
        self._in_thread += len(batch)
        work.add_done_callback(lambda done: self._settle(batch, done))

    def _settle(self, batch: list[_Queued], done: asyncio.Future[list[tuple[OSError | None, float]]]) -> None:
        self._in_thread -= len(batch)
        if done.cancelled() or done.exception() is not None:
            err = done.exception() if not done.cancelled() else None
            self._fast = 0
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(err or OSError("fsync was not run"))
            return
        for queued, (error, seconds) in zip(batch, done.result(), strict=True):
            self._timed(seconds if error is None else math.inf)
            if queued.done.done():
                continue
            if error is None:
                queued.done.set_result(None)
            else:
                queued.done.set_exception(error)


def _sync_all(fds: list[int]) -> list[tuple[OSError | None, float]]:
    """Fsync and close each descriptor: its error (None) and how long its fsync took."""
    outcomes: list[tuple[OSError | None, float]] = []
    for fd in fds:
        started = time.perf_counter()
        try:
            os.fsync(fd)
            outcomes.append((None, time.perf_counter() - started))
        except OSError as err:
            outcomes.append((err, time.perf_counter() - started))
        finally:
            os.close(fd)
    return outcomes
