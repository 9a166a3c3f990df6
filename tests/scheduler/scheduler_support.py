"""Helpers of the scheduler tests: a hand-stepped clock, a recording dispatcher, tasks in a real database."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from farmhost_testing import ManualClock, wait_for_async

from farmhost.config import Settings, build_config
from farmhost.scheduler.clock import SchedulerClock
from farmhost.scheduler.runs import RunReport, TaskRun
from farmhost.scheduler.service import SchedulerService
from farmhost.scheduler.specs import first_run, parse_schedule
from farmhost.store import task_runs, tasks
from farmhost.store.commits import CommitWatcher
from farmhost.store.db import Database, now_utc
from farmhost.store.task_runs import RunRecord
from farmhost.store.tasks import Task, TaskStatus

INTERRUPTED = "interrupted"


def settings_for(data_dir: Path, *, tz: str = "UTC", **extra: Any) -> Settings:
    """Settings of a data dir in zone `tz`; nothing read from the environment or `.env` but defaults."""
    return Settings(_env_file=None, data_dir=data_dir, tz=tz, **extra)  # type: ignore[call-arg]


Clock = ManualClock  # the scheduler's time in these tests: it moves only when a test moves it


@dataclass
class Recorder:
    """The dispatcher: records every run it is handed and answers with `report(run)` (default: ok).

    `delay` keeps a run going for real seconds; `hold` until the awaitable it returns is done (None: no hold).
    """

    report: Callable[[TaskRun], RunReport] = lambda run: RunReport(status="ok", summary=f"done {run.task.id}")
    delay: Callable[[TaskRun], float] = lambda run: 0.0
    hold: Callable[[TaskRun], Awaitable[object] | None] = lambda run: None
    runs: list[TaskRun] = field(default_factory=list)

    async def __call__(self, run: TaskRun) -> RunReport:
        self.runs.append(run)
        pause = self.delay(run)
        if pause:
            await asyncio.sleep(pause)
        held = self.hold(run)
        if held is not None:
            await held
        return self.report(run)

    def due_times(self, task_id: str) -> list[datetime]:
        return [run.due_at for run in self.runs if run.task.id == task_id]


@dataclass
class Harness:
    """A started SchedulerService on a real database, with what it dispatched and how often it changed tasks."""

    service: SchedulerService
    db: Database
    dispatch: Recorder
    changes: list[datetime]


@asynccontextmanager
async def scheduler(
    data_dir: Path,
    *,
    dispatch: Recorder | None = None,
    clock: SchedulerClock | None = None,
    stop: bool = True,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """Run a SchedulerService on `data_dir`'s database for the block (stopped, then the database closed).

    As in the daemon, the one commit watcher tells it when another connection committed. Without `clock` it fires
    on the wall clock, as in the daemon.
    """
    db = Database.open(data_dir)
    commits = CommitWatcher(db)
    recorder = dispatch or Recorder()
    changes: list[datetime] = []
    service = SchedulerService(
        db=db,
        settings=build_config(settings_for(data_dir, **settings)).scheduler,
        dispatch=recorder,
        on_tasks_changed=lambda: changes.append(now_utc()),
        clock=clock,
    )
    commits.subscribe(service.sync)
    await service.start()
    commits.start()
    try:
        yield Harness(service=service, db=db, dispatch=recorder, changes=changes)
    finally:
        await commits.stop()
        if stop:
            await service.stop()
        db.close()


def new_task(
    task_id: str,
    schedule_type: str,
    value: object,
    *,
    now: datetime,
    folder: str = "field",
    tz: str = "UTC",
    next_run: datetime | None = None,
    status: TaskStatus = "active",
) -> Task:
    """A task as `schedule_task` creates it at `now` (anchor = now), with `next_run` overridable."""
    now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # the store keeps milliseconds
    spec = parse_schedule(schedule_type, value, tz=ZoneInfo(tz))
    return Task(
        id=task_id,
        group_folder=folder,
        prompt=f"prompt of {task_id}",
        schedule_type=spec.type.value,
        schedule_value=spec.value,
        context_mode="isolated",
        status=status,
        next_run=next_run if next_run is not None else first_run(spec, tz=ZoneInfo(tz), now=now),
        last_run=None,
        anchor=now,
        created_at=now,
        created_by="test",
    )


def insert(data_dir: Path, *items: Task) -> list[Task]:
    """Store tasks as the tasks/ handler does (on another connection); returns them as stored (milliseconds)."""
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            for task in items:
                tasks.insert_task(conn, task)
        stored = [tasks.get_task(db.conn, task.id) for task in items]
    finally:
        db.close()
    return [task for task in stored if task is not None]


def read_task(data_dir: Path, task_id: str) -> Task:
    """A task as stored now."""
    db = Database.open(data_dir)
    try:
        task = tasks.get_task(db.conn, task_id)
    finally:
        db.close()
    assert task is not None, task_id
    return task


def rows(data_dir: Path, task_id: str) -> list[RunRecord]:
    """Every task_runs row of a task, by due time (read-only, safe while a daemon runs)."""
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        return task_runs.list_runs(conn, task_id, limit=10_000)


def outbox_rows(data_dir: Path) -> list[dict[str, Any]]:
    """Every outbox row (read-only)."""
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM outbox ORDER BY id")]


def grid(anchor: datetime, step: timedelta, count: int, *, first: int = 1) -> list[datetime]:
    """The due times `anchor + k * step` for k = first .. first + count - 1."""
    return [anchor + k * step for k in range(first, first + count)]


def utc(*args: int) -> datetime:
    """An aware UTC datetime."""
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


async def until(condition: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> Any:
    """Await (letting the scheduler run) until `condition()` is truthy, or fail after `timeout` (scaled) seconds."""
    return await wait_for_async(condition, timeout=timeout, what=what)


async def looked(clock: ManualClock, what: str = "the scheduler to look at the clock") -> None:
    """Wait until the scheduler naps on `clock` again: it has claimed every due time up to `clock.now()`."""
    await until(lambda: clock.napping, what=what)


async def step(clock: ManualClock, seconds: float | timedelta) -> datetime:
    """Move `clock` forward and wait until the scheduler has claimed what came due; returns the new time."""
    moment = clock.advance(seconds)
    await looked(clock, what=f"the scheduler to look at the clock at {moment.isoformat()}")
    return moment
