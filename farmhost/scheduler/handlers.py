"""IPC handlers of the tasks/ queue that manage scheduled tasks: schedule, pause, resume, cancel."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Final

from farmhost.errors import Conflict, InvalidRequest, NotAllowed, NotFound, Unauthorized
from farmhost.farm.homeassistant.errors import HaError, HaNotFound
from farmhost.handling import Change, Effect, Handlers, HandlerSpec, RequestContext
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
from farmhost.scheduler.when import ConditionError, parse_condition
from farmhost.store import groups, tasks
from farmhost.store.db import iso
from farmhost.store.tasks import Task

if TYPE_CHECKING:
    from farmhost.config import SchedulerSettings
    from farmhost.farm.homeassistant.client import HAClient

# A when task's entity is looked up in HA before the task is stored; a slow HA only loses the warning.
ENTITY_CHECK_SECONDS: Final = 3.0


class _EntityCheck:
    """The preparer of schedule_task: for a when task on an entity, asks Home Assistant whether it knows it."""

    def __init__(self, ha: HAClient | None) -> None:
        self._ha = ha

    async def __call__(self, ctx: RequestContext, request: AnyRequest) -> object:
        """Return a warning sentence for the result, or None; an invalid schedule is left to `apply` to refuse."""
        assert isinstance(request, ScheduleTaskRequest)
        if request.schedule_type != "when":
            return None
        try:
            condition = parse_condition(request.schedule_value)
        except ConditionError:
            return None
        if condition.entity is None:
            return None
        if self._ha is None:
            return f"Home Assistant is not configured on this host; {condition.entity} cannot be followed until it is"
        try:
            async with asyncio.timeout(ENTITY_CHECK_SECONDS):
                await self._ha.get_state(condition.entity)
        except HaNotFound:
            return (
                f"Home Assistant does not know {condition.entity} (yet); the task waits for it to appear and fires "
                "when its condition becomes true"
            )
        except (HaError, TimeoutError):
            return f"could not ask Home Assistant whether it knows {condition.entity} now; the task is kept"
        return None


def apply_schedule(
    settings: SchedulerSettings, ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection
) -> Outcome:
    """Create a task for the source group (or, from main, for any registered group), in the farm's zone."""
    assert isinstance(request, ScheduleTaskRequest)
    folder = request.groupFolder or ctx.group.folder
    if folder != ctx.group.folder:
        if not ctx.group.is_main:
            raise Unauthorized(f"group {ctx.group.folder!r} may only schedule tasks for itself")
        if groups.get_group(conn, folder) is None:
            raise NotFound(f"groupFolder {folder!r} is not a registered group")
    zone = settings.zone
    try:
        spec = parse_schedule(request.schedule_type, request.schedule_value, tz=zone)
        next_run = first_run(spec, tz=zone, now=ctx.now)
    except ScheduleError as err:
        raise InvalidRequest(str(err)) from None
    task_id = request.taskId or f"task-{time.time_ns()}-{secrets.token_hex(3)}"
    if tasks.get_task(conn, task_id) is not None:
        raise Conflict(f"a task with id {task_id!r} already exists")
    limit = settings.tasks_per_group_max
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
    result: dict[str, object] = {"taskId": task_id, "nextRun": iso(next_run)}
    if spec.type == ScheduleType.WHEN and isinstance(ctx.prepared, str):
        result["warning"] = ctx.prepared
    return Outcome(result=result)


def apply_task_change(
    settings: SchedulerSettings, ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection
) -> Outcome:
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
        next_run = _resumed_next_run(settings, ctx, task)
        tasks.update_status(conn, task.id, "active", next_run=next_run)
        status = "active"
    else:
        tasks.update_status(conn, task.id, "cancelled", next_run=None)
        status, next_run = "cancelled", None
    ctx.changes.add(Change.TASKS)
    return Outcome(result={"taskId": task.id, "status": status, "nextRun": iso(next_run)})


def _resumed_next_run(settings: SchedulerSettings, ctx: RequestContext, task: Task) -> datetime | None:
    if task.next_run is not None and task.next_run > ctx.now:
        return task.next_run
    if task.schedule_type == ScheduleType.WHEN:
        return None  # it waits for its next event; an edge while it was paused is not replayed
    spec = ScheduleSpec(type=ScheduleType(task.schedule_type), value=task.schedule_value)
    upcoming = next_run_after(spec, tz=settings.zone, anchor=task.anchor, now=ctx.now)
    # A once task whose time passed while it was paused runs as soon as it is resumed.
    return upcoming if upcoming is not None else ctx.now


def task_handlers(ha: HAClient | None, settings: SchedulerSettings) -> Handlers:
    """The tasks/ handlers; `ha` answers whether a when task's entity exists (a warning, never a refusal).

    Args:
        ha: the HA client (None: Home Assistant is off).
        settings: the farm's zone (schedules) and the tasks one group may have.
    """
    change = partial(apply_task_change, settings)
    return {
        "schedule_task": HandlerSpec(
            effect=Effect.STATE, apply=partial(apply_schedule, settings), prepare=_EntityCheck(ha)
        ),
        "pause_task": HandlerSpec(effect=Effect.STATE, apply=change),
        "resume_task": HandlerSpec(effect=Effect.STATE, apply=change),
        "cancel_task": HandlerSpec(effect=Effect.STATE, apply=change),
    }
