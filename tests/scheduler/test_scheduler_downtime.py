"""Downtime longer than the grace: the real daemon records the missed due times as skipped and does not run them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from farmhost_testing import Daemon, clean_env, init_data_dir_in_process, wait_for
from scheduler_support import insert, new_task, read_task, rows

SECOND = timedelta(seconds=1)


def test_due_times_missed_beyond_the_grace_are_skipped_not_run(tmp_path: Path) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    # What the host finds after being down: both tasks (stored as the tasks/ handler stores them) were due 2 s ago,
    # more than the 1 s grace. Stored while no daemon runs, so no timing of a start or a stop can make one of them
    # due while a daemon is up.
    now = datetime.now(UTC)
    at = now - 2 * SECOND
    once, interval = insert(
        data_dir,
        new_task("vents-once", "once", at.isoformat(), now=now - 10 * SECOND, folder="main", next_run=at),
        new_task("vents", "interval", "3000", now=at - 3 * SECOND, folder="main"),
    )
    assert once.next_run is not None and interval.next_run is not None
    assert max(once.next_run, interval.next_run) < datetime.now(UTC) - SECOND  # missed by more than the grace
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_TASK_GRACE_SECONDS="1")).start()
    try:
        wait_for(
            lambda: rows(data_dir, "vents-once") and len(runs := rows(data_dir, "vents")) >= 2 and runs[1].finished_at,
            timeout=8,
            what="the skipped rows and the interval's next run, finished",
            seen=lambda: (rows(data_dir, "vents-once"), rows(data_dir, "vents")),
        )
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
    # The next run is the grid's first time after the start, and it does run.
    assert after.status in ("ok", "error") and after.due_at > missed.claimed_at
    assert (after.due_at - interval.anchor) % (3 * SECOND) == timedelta(0)
    assert after.due_at - missed.claimed_at <= 3 * SECOND
    assert "Traceback" not in daemon.log(), daemon.log()
