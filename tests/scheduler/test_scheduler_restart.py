"""Exactly once across kill -9: the real daemon is killed right after a claim and right before one, and restarted."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from farmhost_testing import Daemon, drop, init_data_dir_in_process, ok, wait_for, wait_result
from scheduler_support import grid, read_task, rows

# Much longer than a daemon restart (~1 s, 3 s on a loaded machine): only the due time meant to be missed is.
STEP = timedelta(seconds=4)


def _sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


def test_each_due_time_fires_once_across_kill_9_and_restart(tmp_path: Path) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    daemon = Daemon(data_dir).start()
    request = {"type": "schedule_task", "prompt": "read the rain gauge", "schedule_type": "interval"}
    drop(data_dir, "field", "tasks", {**request, "schedule_value": 4000, "taskId": "gauge", "requestId": "s1"})
    ok(wait_result(data_dir, "field", "s1"))
    due = grid(read_task(data_dir, "gauge").anchor, STEP, 4)
    try:
        # Killed right after the first claim (the run may or may not have reported yet).
        wait_for(lambda: rows(data_dir, "gauge"), timeout=8, interval=0.001, what="the first claim")
        daemon.kill()
        daemon.start()
        # Killed right before the second due time, which then passes while the host is down.
        _sleep_until(due[1] - timedelta(seconds=0.3))
        assert len(rows(data_dir, "gauge")) == 1
        daemon.kill()
        _sleep_until(due[1] + timedelta(seconds=0.3))
        daemon.start()
        wait_for(lambda: len(rows(data_dir, "gauge")) >= 3, timeout=8, what="the third due time")
    finally:
        code = daemon.stop()
    assert code == 0, daemon.log()
    records = rows(data_dir, "gauge")
    # One row per due time, on the grid from the anchor, none missing, none twice (UNIQUE makes a second row for
    # a due time impossible, so a double fire would show up as a gap or an extra, off-grid row).
    assert [r.due_at for r in records] == due[: len(records)]
    assert records[0].status in ("ok", "error", "interrupted")  # interrupted: the kill came before its report
    assert records[1].status in ("ok", "error") and records[1].claimed_at > due[1]  # the missed one, run late once
    assert records[2].status in ("ok", "error", "skipped")
    assert "Traceback" not in daemon.log(), daemon.log()
