"""IPC handlers of the tasks/ queue that manage scheduled tasks: schedule, pause, resume, cancel."""

from __future__ import annotations

import secrets
import sqlite3
import time
from datetime import datetime
from typing import Final

from farmhost.errors import Conflict, InvalidRequest, NotAllowed, NotFound, Unauthorized
from farmhost.ipc.handlers import Change, Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, ScheduleTaskRequest, TaskIdRequest
from farmhost.scheduler.specs import (
    ScheduleError,
    ScheduleSpec,
    ScheduleType,
    first_run,
    next_run_after,
    parse_schedule,
)
from farmhost.store import groups, tasks
from farmhost.store.db import iso
from farmhost.store.tasks import Task


def apply_schedule(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Create a task for the source group (or, from main, for any registered group)."""
    assert isinstance(request, ScheduleTaskRequest)
    folder = request.groupFolder or ctx.group.folder
    if folder != ctx.group.folder:
        if not ctx.group.is_main:
            raise Unauthorized(f"group {ctx.group.folder!r} may only schedule tasks for itself")
        if groups.get_group(conn, folder) is None:
            raise NotFound(f"groupFolder {folder!r} is not a registered group")
    zone = ctx.settings.zone
    try:
        spec = parse_schedule(request.schedule_type, request.schedule_value, tz=zone)
        next_run = first_run(spec, tz=zone, now=ctx.now)
    except ScheduleError as err:
        raise InvalidRequest(str(err)) from None
    task_id = request.taskId or f"task-{time.time_ns()}-{secrets.token_hex(3)}"
    if tasks.get_task(conn, task_id) is not None:
        raise Conflict(f"a task with id {task_id!r} already exists")
    limit = ctx.settings.tasks_per_group_max
    if tasks.count_scheduled(conn, folder) >= limit:
        raise NotAllowed(
            f"group {folder!r} already has {limit} active or paused tasks (the limit); cancel one first "
            "(see current_tasks.json)"
        )
    task = Task(
        id=task_id,
        group_folder=folder,
        prompt=request.prompt,
        schedule_type=spec.type.value,
        schedule_value=spec.value,
        context_mode=request.context_mode,
        status="active",
        next_run=next_run,
        last_run=None,
        anchor=ctx.now,
        created_at=ctx.now,
        created_by=f"{ctx.group.folder}:{ctx.request_id}",
    )
    tasks.insert_task(conn, task)
    ctx.changes.add(Change.TASKS)
    return Outcome(result={"taskId": task_id, "nextRun": iso(next_run)})


def apply_task_change(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Pause, resume or cancel a task the source group owns (main: any task)."""
    assert isinstance(request, TaskIdRequest)
    task = tasks.get_task(conn, request.taskId)
    if task is None or task.status == "cancelled":
        raise NotFound(f"no task with id {request.taskId!r}; see current_tasks.json")
    if not ctx.group.is_main and task.group_folder != ctx.group.folder:
        raise Unauthorized(f"task {task.id!r} belongs to another group")
    if task.status == "completed":
        raise Conflict(f"task {task.id!r} already completed; schedule a new one")
    if request.type == "pause_task":
        if task.status == "paused":
            raise Conflict(f"task {task.id!r} is already paused")
        tasks.update_status(conn, task.id, "paused", next_run=task.next_run)
        status, next_run = "paused", task.next_run
    elif request.type == "resume_task":
        if task.status == "active":
            raise Conflict(f"task {task.id!r} is not paused")
        next_run = _resumed_next_run(ctx, task)
        tasks.update_status(conn, task.id, "active", next_run=next_run)
        status = "active"
    else:
        tasks.update_status(conn, task.id, "cancelled", next_run=None)
        status, next_run = "cancelled", None
    ctx.changes.add(Change.TASKS)
    return Outcome(result={"taskId": task.id, "status": status, "nextRun": iso(next_run)})


def _resumed_next_run(ctx: RequestContext, task: Task) -> datetime:
    if task.next_run is not None and task.next_run > ctx.now:
        return task.next_run
    spec = ScheduleSpec(type=ScheduleType(task.schedule_type), value=task.schedule_value)
    upcoming = next_run_after(spec, tz=ctx.settings.zone, anchor=task.anchor, now=ctx.now)
    # A once task whose time passed while it was paused runs as soon as it is resumed.
    return upcoming if upcoming is not None else ctx.now


HANDLERS: Final[Handlers] = {
    "schedule_task": HandlerSpec(effect=Effect.STATE, apply=apply_schedule),
    "pause_task": HandlerSpec(effect=Effect.STATE, apply=apply_task_change),
    "resume_task": HandlerSpec(effect=Effect.STATE, apply=apply_task_change),
    "cancel_task": HandlerSpec(effect=Effect.STATE, apply=apply_task_change),
}
