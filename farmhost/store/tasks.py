"""The tasks and task_runs tables: scheduled prompts per group and the log of each run."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from farmhost.store.db import iso, parse_iso

TaskStatus = Literal["active", "paused", "completed", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class Task:
    """A scheduled task."""

    id: str
    group_folder: str
    prompt: str
    schedule_type: str
    schedule_value: str
    context_mode: str
    status: TaskStatus
    next_run: datetime | None
    last_run: datetime | None
    anchor: datetime
    created_at: datetime
    created_by: str | None

    def to_snapshot(self) -> dict[str, Any]:
        """The row as `current_tasks.json` lists it."""
        return {
            "id": self.id,
            "groupFolder": self.group_folder,
            "prompt": self.prompt,
            "schedule_type": self.schedule_type,
            "schedule_value": self.schedule_value,
            "context_mode": self.context_mode,
            "status": self.status,
            "next_run": iso(self.next_run),
            "last_run": iso(self.last_run),
        }


def _task(row: sqlite3.Row) -> Task:
    anchor, created = parse_iso(row["anchor"]), parse_iso(row["created_at"])
    assert anchor is not None and created is not None
    return Task(
        id=row["id"],
        group_folder=row["group_folder"],
        prompt=row["prompt"],
        schedule_type=row["schedule_type"],
        schedule_value=row["schedule_value"],
        context_mode=row["context_mode"],
        status=row["status"],
        next_run=parse_iso(row["next_run"]),
        last_run=parse_iso(row["last_run"]),
        anchor=anchor,
        created_at=created,
        created_by=row["created_by"],
    )


def insert_task(conn: sqlite3.Connection, task: Task) -> None:
    """Store a new task."""
    conn.execute(
        "INSERT INTO tasks (id, group_folder, prompt, schedule_type, schedule_value, context_mode, status,"
        " next_run, last_run, anchor, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            task.id,
            task.group_folder,
            task.prompt,
            task.schedule_type,
            task.schedule_value,
            task.context_mode,
            task.status,
            iso(task.next_run),
            iso(task.last_run),
            iso(task.anchor),
            iso(task.created_at),
            task.created_by,
        ),
    )


def get_task(conn: sqlite3.Connection, task_id: str) -> Task | None:
    """One task by id."""
    row = conn.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
    return _task(row) if row else None


def update_status(conn: sqlite3.Connection, task_id: str, status: TaskStatus, *, next_run: datetime | None) -> None:
    """Change a task's status and next run."""
    conn.execute("UPDATE tasks SET status = ?, next_run = ? WHERE id = ?", (status, iso(next_run), task_id))


def set_next_run_if_active(conn: sqlite3.Connection, task_id: str, next_run: datetime) -> None:
    """Set an active task's next run (a paused or cancelled one is left as it is)."""
    conn.execute("UPDATE tasks SET next_run = ? WHERE id = ? AND status = 'active'", (iso(next_run), task_id))


def advance(
    conn: sqlite3.Connection, task_id: str, *, status: TaskStatus, next_run: datetime | None, last_run: datetime | None
) -> None:
    """Move a task past a due time the scheduler claimed or skipped (`last_run` None keeps the old one)."""
    conn.execute(
        "UPDATE tasks SET status = ?, next_run = ?, last_run = COALESCE(?, last_run) WHERE id = ?",
        (status, iso(next_run), iso(last_run), task_id),
    )


def list_tasks(conn: sqlite3.Connection, *, folder: str | None = None, include_cancelled: bool = False) -> list[Task]:
    """Tasks of one group (or all), by next run."""
    where = ["group_folder = ?"] if folder is not None else []
    if not include_cancelled:
        where.append("status != 'cancelled'")  # served by the partial index tasks_live
    sql = "SELECT * FROM tasks" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY next_run IS NULL, next_run, id"
    return [_task(row) for row in conn.execute(sql, () if folder is None else (folder,))]


def count_all(conn: sqlite3.Connection, folder: str) -> int:
    """How many tasks a group has, in any status (cancelled and completed ones too)."""
    return int(conn.execute("SELECT COUNT(*) FROM tasks WHERE group_folder = ?", (folder,)).fetchone()[0])


def count_scheduled(conn: sqlite3.Connection, folder: str) -> int:
    """How many tasks of a group are active or paused."""
    sql = "SELECT COUNT(*) FROM tasks WHERE group_folder = ? AND status != 'cancelled' AND status != 'completed'"
    row = conn.execute(sql, (folder,)).fetchone()
    return int(row[0])
