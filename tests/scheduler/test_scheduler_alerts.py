"""Failure alerts: N failed runs in a row queue one message to the task's group chat; a success resets the count."""

from __future__ import annotations

from datetime import UTC, timedelta
from pathlib import Path

import pytest
from farmhost_testing import FIELD_JID, MAIN_JID, init_data_dir_in_process
from scheduler_support import Clock, Recorder, insert, new_task, outbox_rows, rows, scheduler, utc

from farmhost.scheduler.alerts import alert_if_failing
from farmhost.scheduler.runs import ReportStatus, RunReport, TaskRun
from farmhost.store.db import Database

HOUR = timedelta(hours=1)
# Years ahead: the runs are driven by the injected clock (`run_due`), never by APScheduler's real-time jobs.
BASE = utc(2031, 5, 4, 8, 0)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


def scripted(*statuses: ReportStatus) -> Recorder:
    """A dispatcher that answers with `statuses` in turn, its summary naming the due hour."""
    pending = list(statuses)
    return Recorder(
        report=lambda run: RunReport(status=pending.pop(0), summary=f"pump API said no at {run.due_at:%H:%M}")
    )


async def test_three_failures_in_a_row_queue_exactly_one_alert_and_a_success_resets(data_dir: Path) -> None:
    clock = Clock(BASE)
    dispatch = scripted("error", "error", "timeout", "error", "error", "ok", "error", "error", "error")
    insert(data_dir, new_task("pump", "interval", "3600000", now=BASE, folder="field"))
    queued = []
    async with scheduler(data_dir, dispatch=dispatch, clock=clock) as h:
        for k in range(1, 10):
            clock.set(BASE + k * HOUR)
            assert await h.service.run_due() == 1
            queued.append(len(outbox_rows(data_dir)))
    assert queued == [0, 0, 1, 1, 1, 1, 1, 1, 2]
    assert [r.status for r in rows(data_dir, "pump")][:6] == ["error", "error", "timeout", "error", "error", "ok"]
    first, second = outbox_rows(data_dir)
    assert (first["chat_jid"], first["source_folder"], first["status"]) == (FIELD_JID, None, "pending")
    assert first["message_key"] != second["message_key"]
    text = first["body"]
    assert text.startswith("Scheduled task pump failed 3 times in a row.")
    assert "Last run (due 2031-05-04 11:00 UTC): timeout: pump API said no at 11:00" in text
    assert "pause task pump (pause_task)" in text and "farmhost task runs pump" in text
    assert "Last run (due 2031-05-04 17:00 UTC): error: pump API said no at 17:00" in second["body"]


async def test_skips_do_not_reset_the_count_and_a_restart_never_queues_the_alert_twice(data_dir: Path) -> None:
    clock = Clock(BASE)
    dispatch = scripted("error", "error", "error")
    insert(data_dir, new_task("office", "interval", "3600000", now=BASE, folder="main"))
    async with scheduler(data_dir, dispatch=dispatch, clock=clock, task_failure_alert_after=2) as h:
        clock.set(BASE + HOUR)
        await h.service.run_due()  # error 1
        clock.set(BASE + 3 * HOUR)  # the due time 2 h ago is missed beyond the grace: skipped
        await h.service.run_due()
        clock.set(BASE + 4 * HOUR)
        await h.service.run_due()  # error 2: the alert
    assert [r.status for r in rows(data_dir, "office")] == ["error", "skipped", "error"]
    (alert,) = outbox_rows(data_dir)
    assert alert["chat_jid"] == MAIN_JID and "failed 2 times in a row" in alert["body"]
    # The same run's end recorded again (as after a crash between commit and return) queues nothing new.
    alerting: TaskRun = dispatch.runs[1]
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            assert alert_if_failing(conn, alerting, threshold=2, now=clock.now(), zone=UTC) is False
    finally:
        db.close()
    # A restart, and the task keeps failing: still the one alert.
    async with scheduler(data_dir, dispatch=dispatch, clock=clock, task_failure_alert_after=2) as h:
        clock.set(BASE + 5 * HOUR)
        await h.service.run_due()
    assert len(outbox_rows(data_dir)) == 1 and len(dispatch.runs) == 3
