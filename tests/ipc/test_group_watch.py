"""What wakes a group's directory check: its queue directories being swapped, not the files the host writes there.

The real InotifyWatcher on a real group directory. The host rewrites `host_status.json` and the other snapshots in
`ipc/<folder>/` every few seconds (a dot-temp file, then a rename); those events must not make the daemon re-check
the group's directories and wake its workers, while a swap of a queue directory must, whatever else came before it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from farmhost_testing import scaled

from farmhost.files import DIR_FLAGS, write_json_atomic
from farmhost.ipc.watcher import InotifyWatcher
from farmhost.protocol.codes import HOST_STATUS, Queue


async def test_host_writes_in_a_group_directory_wake_nothing_and_a_queue_swap_wakes_its_check(tmp_path: Path) -> None:
    group = tmp_path / "field"
    for queue in Queue:
        (group / queue.value).mkdir(parents=True)
    checks: list[str] = []
    woken = asyncio.Event()

    def on_group(folder: str) -> None:
        checks.append(folder)
        woken.set()

    watcher = InotifyWatcher(
        on_queue=lambda folder, queue: None,
        on_group=on_group,
        on_overflow=lambda: checks.append("overflow"),
        group_entries=frozenset(queue.value for queue in Queue),
    )
    watcher.start()
    fd = os.open(group, DIR_FLAGS)
    try:
        watcher.watch("field", None, fd)
        for beat in range(20):  # heartbeats and snapshots, as the daemon writes them (durable or not)
            write_json_atomic(fd, HOST_STATUS, {"status": "alive", "beat": beat}, durable=beat % 2 == 0)
            write_json_atomic(fd, "current_tasks.json", [])
        (group / "notes.txt").write_text("an agent's own file beside its queues\n")
        # The swap comes after all of them: once its event is handled, theirs were read too (one ordered queue).
        os.rename(group / Queue.ACTIONS.value, group / ".actions.old")
        await asyncio.wait_for(woken.wait(), timeout=scaled(10))
        await asyncio.sleep(0.1)  # anything still queued behind it
    finally:
        watcher.stop()
        os.close(fd)
    assert checks == ["field"]  # the swap's one event (MOVED_FROM actions); its MOVED_TO names no queue


async def test_a_writers_temp_file_wakes_no_queue_worker_and_its_rename_does(tmp_path: Path) -> None:
    # An agent writes `.r-1.json.tmp`, closes it (IN_CLOSE_WRITE) and renames it to `r-1.json` (IN_MOVED_TO). Only
    # the rename may wake the worker: a wake for the temp file listed the queue for nothing on every request.
    actions = tmp_path / "field" / Queue.ACTIONS.value
    actions.mkdir(parents=True)
    woken: list[tuple[str, str]] = []
    arrived = asyncio.Event()

    def on_queue(folder: str, queue: str) -> None:
        woken.append((folder, queue))
        arrived.set()

    watcher = InotifyWatcher(
        on_queue=on_queue, on_group=lambda folder: None, on_overflow=lambda: None, group_entries=frozenset()
    )
    watcher.start()
    fd = os.open(actions, DIR_FLAGS)
    try:
        watcher.watch("field", Queue.ACTIONS.value, fd)
        for i in range(5):
            (actions / f".r-{i}.json.tmp").write_text('{"type": "ping"}')
            (actions / f"r-{i}.tmp").write_text("not a request name either")
        os.rename(actions / ".r-0.json.tmp", actions / "r-0.json")
        await asyncio.wait_for(arrived.wait(), timeout=scaled(10))
        await asyncio.sleep(0.1)  # anything still queued behind it
        (actions / "r-9.json").write_text('{"type": "ping"}')  # written in place: its close names a request
        arrived.clear()
        await asyncio.wait_for(arrived.wait(), timeout=scaled(10))
    finally:
        watcher.stop()
        os.close(fd)
    assert woken == [("field", Queue.ACTIONS.value)] * 2
