"""FsyncBatch on real descriptors: the fsyncs of one loop turn share one thread call; a failing one fails alone."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from farmhost.ipc.fsyncs import FsyncBatch


class _CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the calls handed to its threads."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def _files(tmp_path: Path, count: int) -> list[int]:
    fds = []
    for i in range(count):
        fd = os.open(tmp_path / f"r-{i}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.write(fd, b'{"ok":true}')
        fds.append(fd)
    return fds


def test_fsyncs_of_one_turn_share_one_thread_call_and_close_their_descriptors(tmp_path: Path) -> None:
    async def main() -> tuple[int, list[int]]:
        executor = _CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        batch = FsyncBatch()
        fds = _files(tmp_path, 8)
        await asyncio.gather(*(batch.sync_and_close(fd) for fd in fds))
        first = executor.calls
        (tmp_path / "later").mkdir()
        await batch.sync_and_close(_files(tmp_path / "later", 1)[0])
        return first, [executor.calls, *fds]

    first, (after, *fds) = asyncio.run(main())
    assert first == 1, "eight fsyncs queued in one turn take one thread call"
    assert after == 2, "a later turn's fsync takes its own"
    assert all(_closed(fd) for fd in fds)


def test_a_failing_fsync_fails_only_its_own_writer(tmp_path: Path) -> None:
    async def main() -> tuple[list[BaseException | None], list[int]]:
        batch = FsyncBatch()
        good = _files(tmp_path, 2)
        read_end, write_end = os.pipe()  # fsync of a pipe fails (EINVAL): stands for a disk error
        os.close(write_end)
        fds = [good[0], read_end, good[1]]
        outcomes = await asyncio.gather(*(batch.sync_and_close(fd) for fd in fds), return_exceptions=True)
        return list(outcomes), fds

    outcomes, fds = asyncio.run(main())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], OSError)
    assert all(_closed(fd) for fd in fds)


def test_a_cancelled_writer_leaves_its_descriptor_to_the_batch(tmp_path: Path) -> None:
    async def main() -> int:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))  # calls run in turn
        batch = FsyncBatch()
        fd, later = _files(tmp_path, 2)
        writer = asyncio.ensure_future(batch.sync_and_close(fd))
        await asyncio.sleep(0)
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        await batch.sync_and_close(later)  # its thread call runs after the cancelled writer's
        return fd

    fd = asyncio.run(main())
    assert _closed(fd)
