"""Downtime longer than the grace: the real daemon records the missed due times as skipped and does not run them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from farmhost_testing import Daemon, clean_env, drop, init_data_dir_in_process, ok, wait_for, wait_result
from scheduler_support import read_task, rows

SECOND = timedelta(seconds=1)


def test_due_times_missed_beyond_the_grace_are_skipped_not_run(tmp_path: Path) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_TASK_GRACE_SECONDS="1")).start()
    at = (datetime.now(UTC) + 3 * SECOND).isoformat(timespec="milliseconds")
    base = {"type": "schedule_task", "prompt": "open the vents"}
    for task_id, kind, value in (("vents-once", "once", at), ("vents", "interval", 3000)):
        payload = {**base, "schedule_type": kind, "schedule_value": value, "taskId": task_id, "requestId": task_id}
        drop(data_dir, "main", "tasks", payload)
        ok(wait_result(data_dir, "main", task_id))
    assert daemon.stop() == 0, daemon.log()  # down before either task is due
    once, interval = read_task(data_dir, "vents-once"), read_task(data_dir, "vents")
    assert once.next_run is not None and interval.next_run is not None
    time.sleep(max(0.0, (max(once.next_run, interval.next_run) - datetime.now(UTC)).total_seconds() + 1.5))
    daemon.start()
    try:
        wait_for(lambda: rows(data_dir, "vents-once") and len(rows(data_dir, "vents")) >= 2, timeout=8)
    finally:
        code = daemon.stop()
    assert code == 0, daemon.log()
    (skipped,) = rows(data_dir, "vents-once")
    assert (skipped.due_at, skipped.status) == (once.next_run, "skipped")
    assert skipped.detail is not None and "more than the 1 s grace" in skipped.detail
    assert skipped.detail.endswith("not run, the task is completed")
    assert (read_task(data_dir, "vents-once").status, read_task(data_dir, "vents-once").next_run) == ("completed", None)
    missed, after = rows(data_dir, "vents")[:2]
    assert (missed.due_at, missed.status) == (interval.next_run, "skipped")
    # The next run is the grid's first time after the restart, and it does run.
    assert after.status in ("ok", "error") and after.due_at > missed.claimed_at
    assert (after.due_at - interval.anchor) % (3 * SECOND) == timedelta(0)
    assert after.due_at - missed.claimed_at <= 3 * SECOND
    assert "Traceback" not in daemon.log(), daemon.log()
