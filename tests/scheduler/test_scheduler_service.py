"""SchedulerService in-process on a real database, real APScheduler and real time with short schedules."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from scheduler_support import Recorder, grid, insert, new_task, read_task, rows, scheduler, until

from farmhost.scheduler.runs import RunReport, TaskRun
from farmhost.store import tasks
from farmhost.store.db import Database, now_utc

SECOND = timedelta(seconds=1)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def test_an_interval_task_fires_once_per_due_time_on_its_anchored_grid(data_dir: Path) -> None:
    (task,) = insert(data_dir, new_task("water", "interval", "1000", now=now_utc()))
    async with scheduler(data_dir) as h:
        await until(lambda: len(h.dispatch.runs) >= 3, timeout=8, what="three runs")
        changes = len(h.changes)
    due = h.dispatch.due_times("water")
    assert due[:3] == grid(task.anchor, SECOND, 3)  # anchor + k * interval exactly: no drift
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
    (task,) = insert(data_dir, new_task("once", "once", (now_utc() + SECOND / 2).isoformat(), now=now_utc()))
    async with scheduler(data_dir) as h:
        await until(lambda: h.dispatch.runs, timeout=5, what="the run")
        await asyncio.sleep(0.6)  # nothing fires again
    assert h.dispatch.due_times("once") == [task.next_run]
    stored = read_task(data_dir, "once")
    assert (stored.status, stored.next_run) == ("completed", None) and stored.last_run is not None
    assert [(r.due_at, r.status) for r in rows(data_dir, "once")] == [(task.next_run, "ok")]


async def test_a_once_task_is_completed_even_when_its_run_crashes(data_dir: Path) -> None:
    def explode(run: TaskRun) -> RunReport:
        raise RuntimeError("the agent exploded")

    insert(data_dir, new_task("boom", "once", (now_utc() + SECOND / 2).isoformat(), now=now_utc()))
    async with scheduler(data_dir, dispatch=Recorder(report=explode)) as h:
        await until(lambda: rows(data_dir, "boom") and rows(data_dir, "boom")[0].finished_at, timeout=5)
        await asyncio.sleep(0.3)
    (record,) = rows(data_dir, "boom")
    assert record.status == "error" and record.detail == "the host failed to run it: RuntimeError: the agent exploded"
    assert len(h.dispatch.runs) == 1 and read_task(data_dir, "boom").status == "completed"


async def test_a_run_in_flight_when_the_host_stops_is_interrupted_and_not_repeated(data_dir: Path) -> None:
    insert(data_dir, new_task("long", "once", (now_utc() + SECOND / 2).isoformat(), now=now_utc()))
    async with scheduler(data_dir, dispatch=Recorder(delay=lambda run: 60)) as h:
        await until(lambda: h.dispatch.runs, timeout=5, what="the run to start")
        (record,) = rows(data_dir, "long")
        assert (record.status, record.finished_at) == ("running", None)
    (record,) = rows(data_dir, "long")
    assert record.status == "interrupted" and record.finished_at is not None
    assert record.detail == "the host was stopped during this run; it was not repeated"
    async with scheduler(data_dir) as again:  # a restart: the claimed due time is never dispatched again
        await asyncio.sleep(0.3)
    assert again.dispatch.runs == [] and len(rows(data_dir, "long")) == 1
    assert read_task(data_dir, "long").status == "completed"


async def test_a_due_time_that_arrives_during_a_slow_run_is_skipped(data_dir: Path) -> None:
    # A 2.5 s run on a 2 s grid: it is still running at t2 whatever the timing (it starts at t1 or later) and ends
    # 1.5 s before t3, a margin a loaded machine's late wake-ups do not eat.
    step, slow_run = 2 * SECOND, 2.5
    (task,) = insert(data_dir, new_task("slow", "interval", "2000", now=now_utc()))
    first_due = task.next_run
    slow = Recorder(delay=lambda run: slow_run if run.due_at == first_due else 0.0)
    async with scheduler(data_dir, dispatch=slow) as h:
        await until(lambda: len(h.dispatch.runs) >= 2, timeout=12, what="the run after the slow one")
    t1, t2, t3 = grid(task.anchor, step, 3)
    assert h.dispatch.due_times("slow")[:2] == [t1, t3]  # t2 was never dispatched
    records = rows(data_dir, "slow")
    assert [(r.due_at, r.status) for r in records[:3]] == [(t1, "ok"), (t2, "skipped"), (t3, "ok")]
    assert records[1].detail == f"previous run (due {t1.isoformat(timespec='milliseconds')}) was still running; not run"
    assert records[0].duration_seconds is not None and records[0].duration_seconds >= slow_run


async def test_a_task_another_process_adds_is_picked_up_without_a_restart(data_dir: Path) -> None:
    async with scheduler(data_dir) as h:
        await asyncio.sleep(0.2)
        task = new_task("late-comer", "interval", "500", now=now_utc())
        insert(data_dir, task)  # another connection, as `farmhost` CLI or a manual fix would commit
        await until(lambda: h.dispatch.runs, timeout=4, what="the new task's first run")
        # Paused the same way: the claim reads the table, so the next due time does not run.
        db = Database.open(data_dir)
        try:
            with db.tx() as conn:
                tasks.update_status(conn, "late-comer", "paused", next_run=read_task(data_dir, "late-comer").next_run)
        finally:
            db.close()
        claimed = rows(data_dir, "late-comer")
        await asyncio.sleep(1.2)  # two due times pass
        assert rows(data_dir, "late-comer") == claimed
    assert h.dispatch.due_times("late-comer")[0] == task.next_run


async def test_a_sub_second_interval_fires_on_its_grid_at_most_once_a_second(data_dir: Path) -> None:
    (task,) = insert(data_dir, new_task("hasty", "interval", "100", now=now_utc()))  # an agent may ask for this
    async with scheduler(data_dir) as h:
        await until(lambda: len(h.dispatch.runs) >= 2, timeout=4, what="two runs")
    due = h.dispatch.due_times("hasty")
    assert due[0] == task.next_run and due[1] - due[0] == SECOND  # the grid's first time a second later
    assert [r.due_at for r in rows(data_dir, "hasty")] == due  # the due times in between leave no rows
    assert all((d - task.anchor) % timedelta(milliseconds=100) == timedelta(0) for d in due)
