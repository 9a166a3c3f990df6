"""FsyncBatch: the result files prepared in one turn of the event loop, fsync'd together in one thread hop.

An fsync can take milliseconds (an SD card), so it never runs on the loop. Each one used to take its own thread
hop (`asyncio.to_thread`): a future, an executor hand-off, a wake-up of the loop, and the interpreter lock passed
back and forth around the thread's Python. Under load several groups' results are written in the same turn of
the loop; queued here, they are fsync'd by one thread call at the start of the next turn, one after the other
(on ext4 the first commits the journal for the rest). Each writer still awaits its own file's fsync before
acting on it, so what is durable when is unchanged.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Queued:
    fd: int
    done: asyncio.Future[None]


class FsyncBatch:
    """Fsyncs and closes descriptors handed over in one turn of the loop, in one thread call."""

    def __init__(self) -> None:
        self._queued: list[_Queued] = []

    async def sync_and_close(self, fd: int) -> None:
        """Fsync `fd` in a thread, then close it (whatever happens: the descriptor is this batch's now).

        Raises:
            OSError: the fsync's error (the file's content may not be on disk).
        """
        loop = asyncio.get_running_loop()
        queued = _Queued(fd, loop.create_future())
        self._queued.append(queued)
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        await asyncio.shield(queued.done)  # a cancelled writer's descriptor is still fsync'd and closed

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        try:
            work = asyncio.get_running_loop().run_in_executor(None, _sync_all, [q.fd for q in batch])
        except RuntimeError as err:  # the executor is shut down (the host is stopping)
            for queued in batch:
                os.close(queued.fd)
                queued.done.set_exception(OSError(f"fsync was not run: {err}"))
            return
        work.add_done_callback(lambda done: _settle(batch, done))


def _sync_all(fds: list[int]) -> list[OSError | None]:
    errors: list[OSError | None] = []
    for fd in fds:
        try:
            os.fsync(fd)
            errors.append(None)
        except OSError as err:
            errors.append(err)
        finally:
            os.close(fd)
    return errors


def _settle(batch: list[_Queued], done: asyncio.Future[list[OSError | None]]) -> None:
    if done.cancelled() or done.exception() is not None:
        err = done.exception() if not done.cancelled() else None
        for queued in batch:
            if not queued.done.done():
                queued.done.set_exception(err or OSError("fsync was not run"))
        return
    for queued, error in zip(batch, done.result(), strict=True):
        if queued.done.done():
            continue
        if error is None:
            queued.done.set_result(None)
        else:
            queued.done.set_exception(error)
