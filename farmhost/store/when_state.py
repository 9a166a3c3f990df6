"""The when_state table: the persisted edge state of each `when` task, so fire-once holds across restarts."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from farmhost.store.db import iso, parse_iso


@dataclass(frozen=True, kw_only=True)
class WhenState:
    """Where a when task's condition stands: true since when, whether that true period fired, the last fire."""

    task_id: str
    true_since: datetime | None = None  # the condition is true since then (None: false, or never seen)
    fired: bool = False  # this true period fired (or was consumed: cooldown, paused, true at creation)
    last_fired: datetime | None = None  # the due time of the last run it asked for (the cooldown counts from it)
    event_due: datetime | None = None  # the due time `event` belongs to
    event: dict[str, Any] | None = None  # what the run's prompt carries: entity, old and new state, when, folded


def get(conn: sqlite3.Connection, task_id: str) -> WhenState | None:
    """The state of one task (None: never evaluated)."""
    row = conn.execute("SELECT * FROM when_state WHERE task_id = ?", (task_id,)).fetchone()
    if row is None:
        return None
    event = json.loads(row["event"]) if row["event"] else None
    return WhenState(
        task_id=row["task_id"],
        true_since=parse_iso(row["true_since"]),
        fired=bool(row["fired"]),
        last_fired=parse_iso(row["last_fired"]),
        event_due=parse_iso(row["event_due"]),
        event=event if isinstance(event, dict) else None,
    )


def put(conn: sqlite3.Connection, state: WhenState, *, at: datetime) -> None:
    """Store a task's state (insert or replace)."""
    conn.execute(
        "INSERT OR REPLACE INTO when_state (task_id, true_since, fired, last_fired, event_due, event, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            state.task_id,
            iso(state.true_since),
            int(state.fired),
            iso(state.last_fired),
            iso(state.event_due),
            json.dumps(state.event, sort_keys=True) if state.event is not None else None,
            iso(at),
        ),
    )


def event_for(conn: sqlite3.Connection, task_id: str, due_at: datetime) -> dict[str, Any] | None:
    """The event that asked for the run due at `due_at` (None: none recorded for that due time)."""
    state = get(conn, task_id)
    if state is None or state.event_due is None or iso(state.event_due) != iso(due_at):
        return None
    return state.event


def move_event(conn: sqlite3.Connection, task_id: str, *, due: datetime, to: datetime) -> None:
    """The event due at `due` (still to run) is now due at `to`: it waited for the task's previous run to end."""
    conn.execute(
        "UPDATE when_state SET event_due = ? WHERE task_id = ? AND event_due = ?", (iso(to), task_id, iso(due))
    )
