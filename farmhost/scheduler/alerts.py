"""Failure alerts: after N consecutive failed runs of a task, one message to its group's chat through the outbox."""

from __future__ import annotations

import logging
import sqlite3
from datetime import datetime, tzinfo

from farmhost.scheduler.runs import FAILED, TaskRun
from farmhost.store import groups, outbox, task_runs
from farmhost.store.db import iso
from farmhost.store.tasks import Task

logger = logging.getLogger(__name__)

_PROMPT_CHARS = 120


def failure_streak(conn: sqlite3.Connection, task_id: str, *, limit: int) -> list[task_runs.RunRecord]:
    """The task's latest failed runs (newest first), up to `limit`, that no successful run interrupts.

    Skipped and interrupted rows neither count nor reset: they say nothing about whether the task works.
    """
    streak = []
    for record in task_runs.recent_outcomes(conn, task_id, limit=limit):
        if record.status not in FAILED:
            break
        streak.append(record)
    return streak


def alert_if_failing(conn: sqlite3.Connection, run: TaskRun, *, threshold: int, now: datetime, zone: tzinfo) -> bool:
    """Queue the alert when this run made the failure streak exactly `threshold` long; returns whether it did.

    Exactly, not at least: a task that keeps failing is reported once, and again only after it succeeded and then
    failed `threshold` times anew. The message key is derived from the run, so the alert is queued at most once
    even if this is called again for the same run; it runs in the transaction that records the run's end.
    """
    streak = failure_streak(conn, run.task.id, limit=threshold + 1)
    if len(streak) != threshold:
        return False
    task = run.task
    group = groups.get_group(conn, task.group_folder)
    if group is None:
        logger.warning(
            "task %s failed %d times in a row; group %s is gone, so no alert", task.id, threshold, task.group_folder
        )
        return False
    text = alert_text(task, streak, zone=zone)
    try:
        outbox.enqueue(
            conn,
            message_key=f"task-failures:{task.id}:{iso(run.due_at)}",
            chat_jid=group.jid,
            source_folder=None,
            chunks=[text],
            at=now,
        )
    except sqlite3.IntegrityError:  # queued already for this run
        return False
    logger.warning("task %s failed %d times in a row; alert queued for %s", task.id, threshold, group.jid)
    return True


def alert_text(task: Task, streak: list[task_runs.RunRecord], *, zone: tzinfo) -> str:
    """The message: which task, how often, the last error, and how to pause it (plain text, well under 4096)."""
    last = streak[0]
    when = last.due_at.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")
    prompt = " ".join(task.prompt.split())
    if len(prompt) > _PROMPT_CHARS:
        prompt = prompt[: _PROMPT_CHARS - 1] + "…"
    return (
        f"Scheduled task {task.id} failed {len(streak)} times in a row.\n"
        f"Task: {prompt}\n"
        f"Schedule: {task.schedule_type} {task.schedule_value}\n"
        f"Last run (due {when}): {last.status}: {last.detail or 'no details'}\n"
        f"It stays scheduled; there is no further alert until it succeeds again. "
        f"To stop it, ask the agent to pause task {task.id} (pause_task) or cancel it (cancel_task). "
        f"History: farmhost task runs {task.id}"
    )
