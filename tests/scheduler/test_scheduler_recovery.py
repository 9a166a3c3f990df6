"""Start-up after downtime or a crash: missed runs fire once within the grace, else are skipped; nothing repeats.

The scheduler runs on a clock the tests hold at the start time (and step), so "nothing else fires" is checked
once it has looked at that time, not after a sleep.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import init_data_dir_in_process
from scheduler_support import Clock, insert, looked, new_task, read_task, rows, scheduler, step, until

from farmhost.scheduler import claims
from farmhost.store.db import Database, iso, now_utc

MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
ZONE = "Europe/Lisbon"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


def _five_minute_mark_before(moment: datetime) -> datetime:
    return moment.replace(minute=moment.minute - moment.minute % 5, second=0, microsecond=0)


async def test_runs_missed_within_the_grace_fire_once_at_start_never_a_burst(data_dir: Path) -> None:
    now = now_utc()
    # Down for ten and a half minutes: ten due times of a one-minute interval passed, the first 9.5 minutes ago.
    interval, cron = insert(
        data_dir,
        new_task("every-minute", "interval", "60000", now=now - 10.5 * MINUTE),
        new_task("five-minutes", "cron", "*/5 * * * *", now=now - HOUR, tz=ZONE),
    )
    # The cron task was last due at the five-minute mark before the latest one: missed by 5 to 10 minutes.
    missed_cron = _five_minute_mark_before(now) - 5 * MINUTE
    db = Database.open(data_dir)
    with db.tx() as conn:
        conn.execute("UPDATE tasks SET next_run = ? WHERE id = 'five-minutes'", (iso(missed_cron),))
    db.close()
    clock = Clock(now)
    async with scheduler(data_dir, tz=ZONE, clock=clock) as h:
        await until(lambda: len(h.dispatch.runs) >= 2, timeout=5, what="both catch-up runs")
        await looked(clock)
    assert h.dispatch.due_times("every-minute") == [interval.next_run]  # once, for the missed due time
    assert h.dispatch.due_times("five-minutes") == [missed_cron]
    assert [r.status for r in rows(data_dir, "every-minute")] == [r.status for r in rows(data_dir, "five-minutes")]
    assert [r.status for r in rows(data_dir, "every-minute")] == ["ok"]
    started = h.dispatch.runs[0].claimed_at
    assert read_task(data_dir, "every-minute").next_run == interval.anchor + 11 * MINUTE  # still on the grid
    assert read_task(data_dir, "five-minutes").next_run == _five_minute_mark_before(started) + 5 * MINUTE
    assert cron.schedule_value == "*/5 * * * *"


async def test_runs_missed_by_more_than_the_grace_are_recorded_skipped_and_not_run(data_dir: Path) -> None:
    now = now_utc()
    hourly, once, daily = insert(
        data_dir,
        new_task("hourly", "interval", "3600000", now=now - 3 * HOUR),
        new_task("once", "once", (now - HOUR).isoformat(), now=now - 2 * HOUR, next_run=now - HOUR),
        new_task("daily", "cron", "0 6 * * *", now=now - 3 * 24 * HOUR, tz=ZONE),
    )
    clock = Clock(now)
    async with scheduler(data_dir, tz=ZONE, task_grace_seconds=900, clock=clock) as h:
        await until(lambda: all(rows(data_dir, t) for t in ("hourly", "once", "daily")), timeout=5)
        await looked(clock)
    assert h.dispatch.runs == []
    for task in (hourly, once, daily):
        (record,) = rows(data_dir, task.id)
        assert (record.due_at, record.status) == (task.next_run, "skipped")
        assert "more than the 900 s grace" in (record.detail or "")
    assert "missed: the host reached this due time 2.0 h late" in (rows(data_dir, "hourly")[0].detail or "")
    assert read_task(data_dir, "hourly").next_run == hourly.anchor + 4 * HOUR  # the grid's next future time
    assert (read_task(data_dir, "once").status, read_task(data_dir, "once").next_run) == ("completed", None)
    next_daily = read_task(data_dir, "daily").next_run
    assert next_daily is not None and now < next_daily <= now + 24 * HOUR
    assert next_daily.astimezone(ZoneInfo(ZONE)).hour == 6


async def test_a_grace_of_zero_skips_missed_runs_but_runs_on_time_ones(data_dir: Path) -> None:
    clock = Clock(now_utc())
    (task,) = insert(data_dir, new_task("tight", "interval", "1000", now=clock.now() - 5.5 * timedelta(seconds=1)))
    async with scheduler(data_dir, task_grace_seconds=0, clock=clock) as h:
        await until(lambda: rows(data_dir, "tight"), what="the missed due time recorded")
        for _ in range(20):  # the clock walks on in 100 ms steps until the first on-time run
            if h.dispatch.runs:
                break
            await step(clock, timedelta(milliseconds=100))
        await until(lambda: h.dispatch.runs, timeout=5, what="the first on-time run")
    first, *_ = rows(data_dir, "tight")
    assert (first.due_at, first.status) == (task.next_run, "skipped")
    assert "more than the 0 s grace" in (first.detail or "")
    # The first run is on the grid, after the skipped claim moved next_run past that moment: anchor + 6 s on an idle
    # machine, a later grid time if the start was late; never a catch-up of a missed one.
    ran = h.dispatch.due_times("tight")[0]
    assert ran > first.claimed_at > first.due_at and (ran - task.anchor) % timedelta(seconds=1) == timedelta(0)
    assert first.due_at not in h.dispatch.due_times("tight")
    assert h.dispatch.runs[0].claimed_at - ran <= claims.ON_TIME  # run on time, as the grace of 0 allows


async def test_a_run_left_running_by_a_crash_is_interrupted_at_start_and_not_repeated(data_dir: Path) -> None:
    now = now_utc()
    once, hourly = insert(
        data_dir,
        new_task("once", "once", (now + timedelta(hours=2)).isoformat(), now=now - HOUR, next_run=now - MINUTE),
        new_task("hourly", "interval", "3600000", now=now - HOUR - MINUTE),
    )
    # What kill -9 right after a claim leaves behind: the claim committed, the run never reported.
    db = Database.open(data_dir)
    for task in (once, hourly):
        assert task.next_run is not None
        with db.tx() as conn:
            claim = claims.claim_due(conn, task_id=task.id, due_at=task.next_run, now=now, zone=UTC, grace=900)
        assert claim.run is not None
    db.close()
    assert [r.status for r in rows(data_dir, "once") + rows(data_dir, "hourly")] == ["running", "running"]
    clock = Clock(now)
    async with scheduler(data_dir, clock=clock) as h:
        await looked(clock)
    assert h.dispatch.runs == []
    for task in (once, hourly):
        (record,) = rows(data_dir, task.id)
        assert record.status == "interrupted" and record.finished_at is not None
        assert record.detail == "the host stopped while this run was running (crash or kill); it was not repeated"
    assert read_task(data_dir, "once").status == "completed"
    assert read_task(data_dir, "hourly").next_run == hourly.anchor + 2 * HOUR


async def test_a_task_whose_group_was_removed_is_skipped(data_dir: Path) -> None:
    now = now_utc()
    (task,) = insert(data_dir, new_task("orphan", "interval", "3600000", now=now - HOUR - 0.1 * MINUTE, folder="gone"))
    async with scheduler(data_dir) as h:
        await until(lambda: rows(data_dir, "orphan"), timeout=5)
    (record,) = rows(data_dir, "orphan")
    assert record.status == "skipped" and h.dispatch.runs == []
    assert record.detail is not None and record.detail.startswith("group 'gone' is not registered any more; not run")
    assert read_task(data_dir, "orphan").next_run == task.anchor + 2 * HOUR
