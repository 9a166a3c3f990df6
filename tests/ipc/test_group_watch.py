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
