"""The task_runs table: one row per due time of a task, claimed before the run starts (UNIQUE task_id, due_at)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from farmhost.store.db import iso, parse_iso


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A row of task_runs: a due time of a task and what became of it."""

    id: int
    task_id: str
    due_at: datetime
    claimed_at: datetime
    finished_at: datetime | None
    status: str
    detail: str | None

    @property
    def duration_seconds(self) -> float | None:
        """From the claim to the end of the run (queue wait included); None while it runs."""
        if self.finished_at is None:
            return None
        return max(0.0, (self.finished_at - self.claimed_at).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view for `farmhost task runs --json`."""
        duration = self.duration_seconds
        return {
            "id": self.id,
            "taskId": self.task_id,
            "dueAt": iso(self.due_at),
            "claimedAt": iso(self.claimed_at),
            "finishedAt": iso(self.finished_at),
            "status": self.status,
            "durationSeconds": None if duration is None else round(duration, 3),
            "summary": self.detail,
        }


def _record(row: sqlite3.Row) -> RunRecord:
    due, claimed = parse_iso(row["due_at"]), parse_iso(row["claimed_at"])
    assert due is not None and claimed is not None
    return RunRecord(
        id=row["id"],
        task_id=row["task_id"],
        due_at=due,
        claimed_at=claimed,
        finished_at=parse_iso(row["finished_at"]),
        status=row["status"],
        detail=row["detail"],
    )


def insert_run(
    conn: sqlite3.Connection,
    *,
    task_id: str,
    due_at: datetime,
    at: datetime,
    status: str = "running",
    detail: str | None = None,
) -> int:
    """Claim a due time (status `running`) or record it as already decided (`skipped`); returns the row id.

    Raises:
        sqlite3.IntegrityError: The due time of this task has a row already (it was claimed before).
    """
    finished = None if status == "running" else iso(at)
    cursor = conn.execute(
        "INSERT INTO task_runs (task_id, due_at, claimed_at, finished_at, status, detail) VALUES (?, ?, ?, ?, ?, ?)",
        (task_id, iso(due_at), iso(at), finished, status, detail),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def finish_run(conn: sqlite3.Connection, run_id: int, *, status: str, detail: str | None, at: datetime) -> bool:
    """Record how a running row ended; False if it was not running any more."""
    cursor = conn.execute(
        "UPDATE task_runs SET status = ?, detail = ?, finished_at = ? WHERE id = ? AND finished_at IS NULL",
        (status, detail, iso(at), run_id),
    )
    return cursor.rowcount == 1


def interrupt_unfinished(conn: sqlite3.Connection, *, detail: str, at: datetime) -> list[RunRecord]:
    """Mark every row still `running` (its host died) as `interrupted`; returns them as they were."""
    rows = [_record(row) for row in conn.execute("SELECT * FROM task_runs WHERE finished_at IS NULL ORDER BY id")]
    conn.execute(
        "UPDATE task_runs SET status = 'interrupted', detail = ?, finished_at = ? WHERE finished_at IS NULL",
        (detail, iso(at)),
    )
    return rows


def list_runs(conn: sqlite3.Connection, task_id: str, *, limit: int = 50) -> list[RunRecord]:
    """The last `limit` rows of a task, oldest first."""
    rows = conn.execute(
        "SELECT * FROM (SELECT * FROM task_runs WHERE task_id = ? ORDER BY due_at DESC, id DESC LIMIT ?)"
        " ORDER BY due_at, id",
        (task_id, limit),
    )
    return [_record(row) for row in rows]


def recent_outcomes(conn: sqlite3.Connection, task_id: str, *, limit: int) -> list[RunRecord]:
    """The last `limit` runs of a task that ran to an end (ok, error, timeout), newest first."""
    rows = conn.execute(
        "SELECT * FROM task_runs WHERE task_id = ? AND status IN ('ok', 'error', 'timeout')"
        " ORDER BY due_at DESC, id DESC LIMIT ?",
        (task_id, limit),
    )
    return [_record(row) for row in rows]


def last_statuses(conn: sqlite3.Connection) -> dict[str, str]:
    """The status of each task's latest row (by due time)."""
    rows = conn.execute(
        "SELECT task_id, status FROM task_runs AS r WHERE id = "
        "(SELECT id FROM task_runs WHERE task_id = r.task_id ORDER BY due_at DESC, id DESC LIMIT 1)"
    )
    return {row[0]: row[1] for row in rows}


def has_run(conn: sqlite3.Connection, task_id: str, due_at: datetime) -> bool:
    """Whether a due time of a task has a row already (claimed, finished or skipped)."""
    row = conn.execute("SELECT 1 FROM task_runs WHERE task_id = ? AND due_at = ?", (task_id, iso(due_at))).fetchone()
    return row is not None


def has_skipped_after(conn: sqlite3.Connection, task_id: str, after: datetime, *, reason: str) -> bool:
    """Whether a task has a `skipped` row due strictly after `after` whose detail starts with `reason`."""
    row = conn.execute(
        "SELECT 1 FROM task_runs WHERE task_id = ? AND due_at > ? AND status = 'skipped' AND substr(detail, 1, ?) = ?"
        " LIMIT 1",
        (task_id, iso(after), len(reason), reason),
    ).fetchone()
    return row is not None


def latest_run(conn: sqlite3.Connection) -> RunRecord | None:
    """The row claimed last, of any task (None before the first)."""
    row = conn.execute("SELECT * FROM task_runs ORDER BY id DESC LIMIT 1").fetchone()
    return _record(row) if row is not None else None


def outcomes_between(conn: sqlite3.Connection, start: datetime, end: datetime) -> list[tuple[str, str]]:
    """(task id, status) of every run that finished from `start` to `end`, skipped due times left out."""
    rows = conn.execute(
        "SELECT task_id, status FROM task_runs WHERE finished_at >= ? AND finished_at <= ? AND status != 'skipped'",
        (iso(start), iso(end)),
    ).fetchall()
    return [(str(task_id), str(status)) for task_id, status in rows]
