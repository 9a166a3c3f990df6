"""SchedulerService in-process on a real database, its jobs firing on a clock the tests step (no wall-clock waits).

The real clock's path (`WallClock` in the daemon) is exercised by test_scheduler_daemon.py, test_scheduler_restart.py
and test_scheduler_downtime.py, and by the one wall-clock test at the end of this file.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from scheduler_support import (
    Clock,
    Recorder,
    grid,
    insert,
    looked,
    new_task,
    read_task,
    rows,
    scheduler,
    step,
    until,
    utc,
)

from farmhost.scheduler.runs import RunReport, TaskRun
from farmhost.store import tasks
from farmhost.store.db import Database

SECOND = timedelta(seconds=1)
BASE = utc(2031, 4, 2, 9, 0)  # years ahead: only the stepped clock makes these tasks due


def finished(data_dir: Path, task_id: str, count: int) -> bool:
    """`count` task_runs rows of `task_id` have ended."""
    return sum(r.finished_at is not None for r in rows(data_dir, task_id)) >= count


def settled(data_dir: Path, task_id: str) -> bool:
    """Every claimed run of `task_id` has ended."""
    return all(r.finished_at is not None for r in rows(data_dir, task_id))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def test_an_interval_task_fires_once_per_due_time_on_its_anchored_grid(data_dir: Path) -> None:
    clock = Clock(BASE)
    (task,) = insert(data_dir, new_task("water", "interval", "1000", now=BASE))
    async with scheduler(data_dir, clock=clock) as h:
        for k in range(1, 4):
            await step(clock, SECOND)
            await until(partial(finished, data_dir, "water", k), what=f"run {k} to end")
        changes = len(h.changes)
    due = h.dispatch.due_times("water")
    assert due == grid(task.anchor, SECOND, 3)  # anchor + k * interval exactly: no drift
    assert len(set(due)) == len(due)
    records = rows(data_dir, "water")
    assert [r.due_at for r in records] == due  # one row per dispatched due time, nothing else
    assert {(r.status, r.detail) for r in records} == {("ok", "done water")}
    assert all(r.finished_at is not None and r.claimed_at >= r.due_at for r in records)
    stored = read_task(data_dir, "water")
    assert stored.status == "active" and stored.next_run == due[-1] + SECOND
    assert stored.last_run is not None and stored.last_run >= due[-1]
    assert changes >= 3  # the snapshots are rewritten after each claim


async def test_a_once_task_runs_once_and_completes(data_dir: Path) -> None:
    clock = Clock(BASE)
    (task,) = insert(data_dir, new_task("once", "once", (BASE + SECOND / 2).isoformat(), now=BASE))
    async with scheduler(data_dir, clock=clock) as h:
        await step(clock, SECOND / 2)
        await until(lambda: finished(data_dir, "once", 1), what="the run to end")
        for _ in range(3):  # nothing fires again
            await step(clock, SECOND)
    assert h.dispatch.due_times("once") == [task.next_run]
    stored = read_task(data_dir, "once")
    assert (stored.status, stored.next_run) == ("completed", None) and stored.last_run is not None
    assert [(r.due_at, r.status) for r in rows(data_dir, "once")] == [(task.next_run, "ok")]


async def test_a_once_task_is_completed_even_when_its_run_crashes(data_dir: Path) -> None:
    def explode(run: TaskRun) -> RunReport:
        raise RuntimeError("the agent exploded")

    clock = Clock(BASE)
    insert(data_dir, new_task("boom", "once", (BASE + SECOND / 2).isoformat(), now=BASE))
    async with scheduler(data_dir, dispatch=Recorder(report=explode), clock=clock) as h:
        await step(clock, SECOND / 2)
        await until(lambda: finished(data_dir, "boom", 1), what="the run to end")
        await step(clock, SECOND)  # nothing fires again
    (record,) = rows(data_dir, "boom")
    assert record.status == "error" and record.detail == "the host failed to run it: RuntimeError: the agent exploded"
    assert len(h.dispatch.runs) == 1 and read_task(data_dir, "boom").status == "completed"


async def test_a_run_in_flight_when_the_host_stops_is_interrupted_and_not_repeated(data_dir: Path) -> None:
    clock = Clock(BASE)
    insert(data_dir, new_task("long", "once", (BASE + SECOND / 2).isoformat(), now=BASE))
    async with scheduler(data_dir, dispatch=Recorder(hold=lambda run: asyncio.Event().wait()), clock=clock) as h:
        await step(clock, SECOND / 2)
        await until(lambda: h.dispatch.runs, what="the run to start")
        (record,) = rows(data_dir, "long")
        assert (record.status, record.finished_at) == ("running", None)
    (record,) = rows(data_dir, "long")
    assert record.status == "interrupted" and record.finished_at is not None
    assert record.detail == "the host was stopped during this run; it was not repeated"
    async with scheduler(data_dir, clock=clock) as again:  # a restart: the claimed due time is never dispatched again
        await looked(clock)
        await step(clock, SECOND)
    assert again.dispatch.runs == [] and len(rows(data_dir, "long")) == 1
    assert read_task(data_dir, "long").status == "completed"


async def test_a_due_time_that_arrives_during_a_slow_run_is_skipped(data_dir: Path) -> None:
    # A 2.5 s run on a 2 s grid: it is still running at t2 and ends 1.5 s before t3.
    interval, slow_run = 2 * SECOND, 2.5 * SECOND
    clock = Clock(BASE)
    (task,) = insert(data_dir, new_task("slow", "interval", "2000", now=BASE))
    t1, t2, t3 = grid(task.anchor, interval, 3)
    released = asyncio.Event()
    slow = Recorder(hold=lambda run: released.wait() if run.due_at == t1 else None)
    async with scheduler(data_dir, dispatch=slow, clock=clock) as h:
        await step(clock, t1 - clock.now())
        await until(lambda: h.dispatch.runs, what="the slow run to start")
        for _ in range(5):  # t2 passes while it runs
            await step(clock, slow_run / 5)
        released.set()
        await until(lambda: finished(data_dir, "slow", 1) and read_task(data_dir, "slow").next_run == t3)
        await step(clock, t3 - clock.now())
        await until(lambda: finished(data_dir, "slow", 3), what="the run after the slow one")
    assert h.dispatch.due_times("slow")[:2] == [t1, t3]  # t2 was never dispatched
    records = rows(data_dir, "slow")
    assert [(r.due_at, r.status) for r in records[:3]] == [(t1, "ok"), (t2, "skipped"), (t3, "ok")]
    assert records[1].detail == f"previous run (due {t1.isoformat(timespec='milliseconds')}) was still running; not run"
    assert records[0].duration_seconds is not None and records[0].duration_seconds >= slow_run.total_seconds()


async def test_a_task_another_process_adds_is_picked_up_without_a_restart(data_dir: Path) -> None:
    clock = Clock(BASE)
    async with scheduler(data_dir, clock=clock) as h:
        await looked(clock)
        task = new_task("late-comer", "interval", "500", now=BASE)
        insert(data_dir, task)  # another connection, as `farmhost` CLI or a manual fix would commit
        await until(lambda: read_task(data_dir, "late-comer"), what="the task stored")
        clock.advance(SECOND / 2)  # its first due time, now: only the commit watcher's news makes it a job
        await until(lambda: h.dispatch.runs, what="the new task's first run")
        # Paused the same way: the claim reads the table, so the next due time does not run.
        db = Database.open(data_dir)
        try:
            with db.tx() as conn:
                tasks.update_status(conn, "late-comer", "paused", next_run=read_task(data_dir, "late-comer").next_run)
        finally:
            db.close()
        claimed = rows(data_dir, "late-comer")
        for _ in range(3):  # two due times pass (a run at most once a second)
            await step(clock, SECOND * 0.6)
        assert rows(data_dir, "late-comer") == claimed
    assert h.dispatch.due_times("late-comer")[0] == task.next_run


async def test_a_sub_second_interval_fires_on_its_grid_at_most_once_a_second(data_dir: Path) -> None:
    clock = Clock(BASE)
    (task,) = insert(data_dir, new_task("hasty", "interval", "100", now=BASE))  # an agent may ask for this
    async with scheduler(data_dir, clock=clock) as h:
        for _ in range(11):  # 1.1 s in the clock's 100 ms steps, each run ended before the next step
            await step(clock, SECOND / 10)
            await until(partial(settled, data_dir, "hasty"), what="every claimed run to end")
    assert len(h.dispatch.runs) == 2
    due = h.dispatch.due_times("hasty")
    assert due[0] == task.next_run and due[1] - due[0] == SECOND  # the grid's first time a second later
    assert [r.due_at for r in rows(data_dir, "hasty")] == due  # the due times in between leave no rows
    assert all((d - task.anchor) % timedelta(milliseconds=100) == timedelta(0) for d in due)
