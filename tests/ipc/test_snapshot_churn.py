"""Snapshots are rewritten only in the groups whose view changed, and never hold up a queue."""

from __future__ import annotations

import json
import os
from pathlib import Path

from farmhost_testing import Daemon, clean_env, drop, farmhost, wait_for, wait_result
from ipc_support import uid

OTHERS = [f"crew{n}" for n in range(6)]


def _identity(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_ino, info.st_mtime_ns


def test_a_task_change_rewrites_only_the_views_it_changes(data_dir: Path) -> None:
    for n, folder in enumerate(OTHERS):
        done = farmhost(
            "group", "add", "--jid", f"telegram:{300 + n}", "--name", folder, "--folder", folder, data_dir=data_dir
        )
        assert done.returncode == 0, done.stderr
    # No heartbeat during the test: only the change itself may touch the snapshots.
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_HEARTBEAT_SECONDS="300")).start()
    try:
        ipc = data_dir / "ipc"
        wait_for(lambda: all((ipc / f / "current_tasks.json").exists() for f in OTHERS), what="first snapshots")
        before = {
            (f, name): _identity(ipc / f / name)
            for f in ["main", "field", *OTHERS]
            for name in ("current_tasks.json", "available_groups.json", "host_status.json")
        }
        rid = uid("task")
        task = {
            "type": "schedule_task",
            "requestId": rid,
            "taskId": rid,
            "prompt": "check pump 2",
            "schedule_type": "interval",
            "schedule_value": "3600000",
        }
        drop(data_dir, "field", "tasks", task)
        assert wait_result(data_dir, "field", rid)["status"] == "success"

        def shows_task(folder: str) -> bool:
            tasks = json.loads((ipc / folder / "current_tasks.json").read_text())
            return any(t["id"] == rid for t in tasks)

        wait_for(lambda: shows_task("field") and shows_task("main"), what="field's and main's views updated")
        after = {key: _identity(ipc / key[0] / key[1]) for key in before}
        changed = sorted(key for key in before if before[key] != after[key])
        assert changed == [("field", "current_tasks.json"), ("main", "current_tasks.json")], changed
        # The agent of a group whose view did not change still gets a fresh copy before it runs (and at start).
    finally:
        assert daemon.stop() == 0
