"""FsyncBatch on real descriptors: the fsyncs of one loop turn share one thread call; a failing one fails alone."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from farmhost.ipc.fsyncs import FAST_STREAK, FsyncBatch


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


def test_a_lone_fsync_runs_on_the_loop_once_the_disk_proved_fast_and_a_slow_one_sends_it_back(tmp_path: Path) -> None:
    async def main(inline_below_s: float) -> tuple[list[int], list[int], FsyncBatch]:
        executor = _CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        batch = FsyncBatch(inline_below_s=inline_below_s)
        calls = []
        fds = _files(tmp_path, 2 * FAST_STREAK + 2)
        for fd in fds[: FAST_STREAK + 1]:  # alone, one after the other
            await batch.sync_and_close(fd, alone=True)
            calls.append(executor.calls)
        await asyncio.gather(*(batch.sync_and_close(fd) for fd in fds[FAST_STREAK + 1 : FAST_STREAK + 3]))
        calls.append(executor.calls)  # not alone: still the thread
        for fd in fds[FAST_STREAK + 3 :]:
            await batch.sync_and_close(fd, alone=True)
        calls.append(executor.calls)
        return calls, fds, batch

    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    calls, fds, batch = asyncio.run(main(inline_below_s=60.0))  # every real fsync counts as fast
    assert calls[:FAST_STREAK] == list(range(1, FAST_STREAK + 1)), "a disk not yet seen fast: each in a thread"
    assert calls[FAST_STREAK] == FAST_STREAK, f"after {FAST_STREAK} fast fsyncs a lone one runs on the loop"
    assert calls[-2] == FAST_STREAK + 1, "fsyncs of requests side by side still share a thread call"
    assert calls[-1] == FAST_STREAK + 1 and batch.inline == 1 + FAST_STREAK - 1
    assert all(_closed(fd) for fd in fds)

    for name in os.listdir(tmp_path):
        os.unlink(tmp_path / name)
    calls, fds, batch = asyncio.run(main(inline_below_s=0.0))  # a disk never fast enough (an SD card)
    assert calls[FAST_STREAK] == FAST_STREAK + 1 and batch.inline == 0, "a slow disk's fsyncs never run on the loop"
    assert all(_closed(fd) for fd in fds)


def test_a_failing_fsync_on_the_loop_raises_closes_and_sends_the_next_to_the_thread(tmp_path: Path) -> None:
    async def main() -> tuple[BaseException | None, int, int, int]:
        executor = _CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        batch = FsyncBatch(inline_below_s=60.0)
        for fd in _files(tmp_path, FAST_STREAK):
            await batch.sync_and_close(fd, alone=True)
        read_end, write_end = os.pipe()  # fsync of a pipe fails (EINVAL): stands for a disk error
        os.close(write_end)
        before = executor.calls
        failure = None
        try:
            await batch.sync_and_close(read_end, alone=True)
        except OSError as err:
            failure = err
        assert executor.calls == before, "it ran on the loop"
        (tmp_path / "later").mkdir()
        await batch.sync_and_close(_files(tmp_path / "later", 1)[0], alone=True)
        return failure, read_end, before, executor.calls

    failure, fd, before, after = asyncio.run(main())
    assert isinstance(failure, OSError)
    assert _closed(fd)
    assert after == before + 1, "after a failure the next lone fsync goes to the thread again"
