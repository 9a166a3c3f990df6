"""Exactly once across kill -9: the real daemon is killed right after a claim and right before one, and restarted."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from farmhost_testing import Daemon, drop, hold_for, init_data_dir_in_process, ok, wait_for, wait_result
from scheduler_support import grid, read_task, rows

# The kill before a due time comes BEFORE it, the start after it AFTER it. The interval (the step) is a hold: each
# restart must fit in the rest of a step before the next due time, so the step is sized by a restart of the daemon
# just measured (well under 0.1 s forked, ~1 s exec'd), never by the load average: 3 s at least, whole seconds.
BEFORE, AFTER = timedelta(seconds=1), timedelta(seconds=1)  # AFTER: late past claims.ON_TIME, a catch-up
LEAST_STEP = 3


def _sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


def test_each_due_time_fires_once_across_kill_9_and_restart(tmp_path: Path) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    daemon = Daemon(data_dir).start()  # the first start may include the fork server's: not what a restart takes
    started = time.monotonic()
    daemon.kill()
    daemon.start()
    restart_took = time.monotonic() - started
    # A restart fits in the step with BEFORE to spare; whole seconds (the interval is in milliseconds).
    step = timedelta(seconds=math.ceil(BEFORE.total_seconds() + hold_for(restart_took, least=LEAST_STEP - 1)))
    request = {"type": "schedule_task", "prompt": "read the rain gauge", "schedule_type": "interval"}
    interval_ms = step // timedelta(milliseconds=1)
    drop(data_dir, "field", "tasks", {**request, "schedule_value": interval_ms, "taskId": "gauge", "requestId": "s1"})
    ok(wait_result(data_dir, "field", "s1"))
    due = grid(read_task(data_dir, "gauge").anchor, step, 4)
    try:
        # Killed right after the first claim (the run may or may not have reported yet).
        wait_for(
            lambda: rows(data_dir, "gauge"), timeout=step.total_seconds() + 8, interval=0.001, what="the first claim"
        )
        daemon.kill()
        daemon.start()
        # Killed right before the second due time, which then passes while the host is down.
        assert datetime.now(UTC) < due[1] - BEFORE, f"the restart took too long: it is past {due[1] - BEFORE}"
        _sleep_until(due[1] - BEFORE)
        assert len(rows(data_dir, "gauge")) == 1, rows(data_dir, "gauge")
        daemon.kill()
        _sleep_until(due[1] + AFTER)
        daemon.start()
        wait_for(
            lambda: len(records := rows(data_dir, "gauge")) >= 3 and records[2].finished_at,
            timeout=step.total_seconds() + 8,
            what="the third due time's run to end",
            seen=lambda: rows(data_dir, "gauge"),
        )
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
