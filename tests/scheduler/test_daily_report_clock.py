"""The morning report's loop and the wall clock: a clock stepped forward still gets that day's report, that day.

The step is NTP on a Pi without a real-time clock, after booting on the stale time it shut down with.

The real DailyReport on a real database with a registered main chat; only its clock is the test's (a wall clock
the test steps, as NTP does); Home Assistant is off, so the report tells what the database holds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from scheduler_support import settings_for, until

from farmhost.agents.limits import LimitsReader
from farmhost.config import build_config
from farmhost.layout import DataLayout
from farmhost.scheduler.daily_report import DailyReport, report_key
from farmhost.store import groups, outbox
from farmhost.store.db import Database


async def test_a_wall_clock_stepped_forward_after_the_loop_slept_still_gets_that_days_report(data_dir: Path) -> None:
    config = build_config(settings_for(data_dir, tz="Europe/Amsterdam", daily_report="07:00"))
    db = Database.open(data_dir)
    main = groups.main_group(db.conn)
    assert main is not None  # the data dir of the tests has its main chat registered
    # Booted on the time the Pi shut down with, two days ago after the report time: the next report looks 23 h away.
    wall = [datetime(2026, 3, 10, 8, 0, tzinfo=UTC)]
    report = DailyReport(
        db=db,
        layout=DataLayout(data_dir),
        settings=config.report,
        ha=None,
        limits=LimitsReader.of(DataLayout(data_dir).agent_limits, config.agents),
        wake_outbox=lambda: None,
        clock=lambda: wall[0],
        look_seconds=0.05,
    )
    with db.tx() as conn:  # that stale day's report went out before the shutdown
        outbox.enqueue(conn, message_key=report_key("2026-03-10"), chat_jid=main.jid, source_folder=None,
                       chunks=["sent"], at=wall[0])  # fmt: skip
    await report.start()
    try:
        await until(lambda: report._queued_day == "2026-03-10", what="the loop to look at the stale day")
        wall[0] = datetime(2026, 3, 12, 6, 30, tzinfo=UTC)  # NTP: today, 07:30 in Amsterdam, past the report time
        await until(lambda: outbox.has_key(db.conn, report_key("2026-03-12")), timeout=5, what="today's report, today")
    finally:
        await report.stop()
        db.close()
