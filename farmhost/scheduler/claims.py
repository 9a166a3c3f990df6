"""The scheduler's decisions, each one database transaction: claim a due time, record a run's end, recover.

A due time is claimed before anything runs: in one transaction the task is checked (still active, its next_run is
this due time), the task_runs row is inserted (UNIQUE task_id, due_at: a second claim is impossible) and next_run
is advanced on the schedule's grid. Whatever happens afterwards (a crash, a slow run, a restart) that due time is
never dispatched again. These functions must be called inside `Database.tx()`; they never await.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Final

from farmhost.scheduler.alerts import alert_if_failing
from farmhost.scheduler.runs import RunReport, TaskRun, trim_summary
from farmhost.scheduler.specs import ScheduleSpec, ScheduleType, next_run_after
from farmhost.store import groups, task_runs, tasks, when_state
from farmhost.store.db import iso
from farmhost.store.tasks import Task, TaskStatus

# A run that starts within a second of its due time is on time whatever the grace: the event loop wakes a few
# milliseconds late, and a grace of 0 must mean "no catching up after downtime", not "never run".
ON_TIME: Final = timedelta(seconds=1)
# A task fires at most once a second: an agent may ask for a 1 ms interval (the contract allows any), and each fire
# costs fsyncs and an agent run. Faster intervals fire on their own grid, at most one due time per second.
MIN_SPACING: Final = timedelta(seconds=1)
_TICK: Final = timedelta(microseconds=1)
INTERRUPTED_BY_CRASH: Final = "the host stopped while this run was running (crash or kill); it was not repeated"
INTERRUPTED_BY_STOP: Final = "the host was stopped during this run; it was not repeated"


@dataclass(frozen=True, kw_only=True)
class Claim:
    """What claiming a due time decided."""

    run: TaskRun | None = None  # claimed: dispatch it
    task_changed: bool = False  # next_run/last_run/status changed: rewrite the snapshots
    note: str | None = None  # why nothing runs, for the log


def claim_due(
    conn: sqlite3.Connection, *, task_id: str, due_at: datetime, now: datetime, zone: tzinfo, grace: float
) -> Claim:
    """Claim the due time `due_at` of a task, or record it as skipped, advancing the task either way.

    Args:
        conn: The connection, inside a write transaction.
        task_id: The task.
        due_at: The due time the job was scheduled for; nothing happens unless it is still the task's next_run.
        now: The current time (aware).
        zone: The farm's timezone (cron).
        grace: How late (seconds) a run may start, e.g. after downtime; later it is skipped.

    Returns:
        The claim: a run to dispatch, or a note saying why there is none.
    """
    task = tasks.get_task(conn, task_id)
    if task is None or task.status != "active" or task.next_run is None or iso(task.next_run) != iso(due_at):
        return Claim(note="no longer due: the task changed, or this due time was claimed already")
    if due_at > now:
        return Claim(note="not due yet")
    upcoming = _upcoming(task, zone=zone, due_at=due_at, now=now)
    status = _status_after(task, upcoming)
    why_not = _why_not_run(conn, task, late=now - due_at, grace=grace, upcoming=upcoming)
    try:
        run_id = task_runs.insert_run(
            conn,
            task_id=task.id,
            due_at=due_at,
            at=now,
            status="skipped" if why_not else "running",
            detail=why_not,
        )
    except sqlite3.IntegrityError:  # only if the clock stepped back onto a claimed due time: never twice
        tasks.advance(conn, task.id, status=status, next_run=upcoming, last_run=None)
        return Claim(task_changed=True, note=f"due time {iso(due_at)} has a run already; not run again")
    tasks.advance(conn, task.id, status=status, next_run=upcoming, last_run=None if why_not else now)
    if why_not:
        return Claim(task_changed=True, note=why_not)
    run = TaskRun(run_id=run_id, task=task, due_at=due_at, claimed_at=now)
    return Claim(run=run, task_changed=True)


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """What recording a run's end did besides that."""

    recorded: bool  # False: the row had been finished already (nothing else was done)
    alerted: bool = False  # the failure alert was queued
    task_changed: bool = False  # a due time that passed during the run was skipped and next_run advanced
    note: str | None = None


def record_end(
    conn: sqlite3.Connection,
    run: TaskRun,
    report: RunReport,
    *,
    now: datetime,
    zone: tzinfo,
    alert_after: int,
) -> RunEnd:
    """Record a dispatched run's status and summary; queue a failure alert; skip a due time it overran.

    A due time that arrived while this run was still running is recorded `skipped` ("previous run still
    running") and next_run moves on to the grid's next time after `now`: a slow task never piles up runs. A when
    task's event is not a grid time that comes again: it waits, and is due now, when this run ended.
    """
    if not task_runs.finish_run(conn, run.run_id, status=report.status, detail=trim_summary(report.summary), at=now):
        return RunEnd(recorded=False)
    alerted = alert_if_failing(conn, run, threshold=alert_after, now=now, zone=zone)
    task = tasks.get_task(conn, run.task.id)
    if task is None or task.status != "active" or task.next_run is None or task.next_run > now:
        return RunEnd(recorded=True, alerted=alerted)
    if task.schedule_type == ScheduleType.WHEN:
        when_state.move_event(conn, task.id, due=task.next_run, to=now)
        tasks.set_next_run_if_active(conn, task.id, now)
        note = f"the event due {iso(task.next_run)} waited for the previous run (due {iso(run.due_at)}); runs now"
        return RunEnd(recorded=True, alerted=alerted, task_changed=True, note=note)
    upcoming = _upcoming(task, zone=zone, due_at=task.next_run, now=now)
    note = f"previous run (due {iso(run.due_at)}) was still running; not run"
    # IntegrityError: the clock stepped back onto a recorded due time; moving on is all that is left to do.
    with contextlib.suppress(sqlite3.IntegrityError):
        task_runs.insert_run(conn, task_id=task.id, due_at=task.next_run, at=now, status="skipped", detail=note)
    tasks.advance(conn, task.id, status=_status_after(task, upcoming), next_run=upcoming, last_run=None)
    return RunEnd(recorded=True, alerted=alerted, task_changed=True, note=note)


def record_interrupted(conn: sqlite3.Connection, run: TaskRun, *, now: datetime) -> bool:
    """The host is stopping while `run` runs: it ends `interrupted` and is not repeated."""
    return task_runs.finish_run(conn, run.run_id, status="interrupted", detail=INTERRUPTED_BY_STOP, at=now)


def recover(conn: sqlite3.Connection, *, now: datetime) -> list[task_runs.RunRecord]:
    """At start: rows a dead host left `running` become `interrupted` (they were claimed, so never re-run)."""
    return task_runs.interrupt_unfinished(conn, detail=INTERRUPTED_BY_CRASH, at=now)


def _upcoming(task: Task, *, zone: tzinfo, due_at: datetime, now: datetime) -> datetime | None:
    """The first due time on the task's grid after both `now` and `MIN_SPACING` after `due_at`."""
    spec = ScheduleSpec(type=ScheduleType(task.schedule_type), value=task.schedule_value)
    return next_run_after(spec, tz=zone, anchor=task.anchor, now=max(now, due_at + MIN_SPACING - _TICK))


def _status_after(task: Task, upcoming: datetime | None) -> TaskStatus:
    """A task with no next due time is completed, except a when task: it waits for its next event."""
    if upcoming is not None or task.schedule_type == ScheduleType.WHEN:
        return "active"
    return "completed"


def _why_not_run(
    conn: sqlite3.Connection, task: Task, *, late: timedelta, grace: float, upcoming: datetime | None
) -> str | None:
    then = f"next run {iso(upcoming)}" if upcoming else "the task is completed"
    if late > max(timedelta(seconds=grace), ON_TIME):
        return (
            f"missed: the host reached this due time {_human(late)} late (was it down?), more than the "
            f"{grace:g} s grace (FARMHOST_TASK_GRACE_SECONDS); not run, {then}"
        )
    if groups.get_group(conn, task.group_folder) is None:
        return f"group {task.group_folder!r} is not registered any more; not run, {then}"
    return None


def _human(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
