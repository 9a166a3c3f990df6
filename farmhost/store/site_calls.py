"""The site_calls table: the farm actions this site sent to another site and has no answer for yet, durably.

A row is written before the request is first published and is the local queue of what the target has not
answered: re-sent after every reconnect, when the target comes back online, and every few seconds until the
answer arrives or the deadline passes. Sending again is safe because the target executes each id once (its
ledger) and answers a repeat with the stored result. One row per (group, requestId): a request recovered from
the spool after a crash finds its row and waits for the same answer instead of asking twice.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from farmhost.store.db import iso, parse_iso

Status = Literal["pending", "answered", "gave_up"]
KEEP_DAYS: Final = 7  # answered rows are kept this long for `doctor` and the logs, then forgotten


@dataclass(frozen=True, kw_only=True)
class SiteCall:
    """One farm action sent to `target`, and its answer once it came."""

    id: str
    group_folder: str
    request_id: str
    target: str
    message: str  # the call as sent (JSON)
    deadline: datetime
    status: Status
    sends: int = 0
    result: dict[str, Any] | None = None


def for_request(conn: sqlite3.Connection, folder: str, request_id: str) -> SiteCall | None:
    """The call made for this request, if one was made."""
    row = conn.execute(
        "SELECT * FROM site_calls WHERE group_folder = ? AND request_id = ?", (folder, request_id)
    ).fetchone()
    return None if row is None else _row(row)


def get(conn: sqlite3.Connection, call_id: str) -> SiteCall | None:
    """The call `call_id`."""
    row = conn.execute("SELECT * FROM site_calls WHERE id = ?", (call_id,)).fetchone()
    return None if row is None else _row(row)


def insert(conn: sqlite3.Connection, call: SiteCall, *, at: datetime) -> None:
    """Record a new call (pending)."""
    conn.execute(
        "INSERT INTO site_calls (id, group_folder, request_id, target, message, deadline, status, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
        (call.id, call.group_folder, call.request_id, call.target, call.message, iso(call.deadline),
         iso(at)),
    )  # fmt: skip


def pending(conn: sqlite3.Connection, target: str | None = None) -> list[SiteCall]:
    """The calls still waiting for an answer (of one target, or all), oldest first."""
    sql = "SELECT * FROM site_calls WHERE status = 'pending'" + (" AND target = ?" if target else "")
    rows = conn.execute(sql + " ORDER BY created_at, id", (target,) if target else ()).fetchall()
    return [_row(row) for row in rows]


def count_sent(conn: sqlite3.Connection, call_ids: list[str]) -> None:
    """The calls were handed to the broker once more."""
    conn.executemany("UPDATE site_calls SET sends = sends + 1 WHERE id = ?", [(i,) for i in call_ids])


def answer(conn: sqlite3.Connection, call_id: str, result: dict[str, Any], *, at: datetime) -> bool:
    """Store the target's answer; False when the call is unknown or not pending (a repeat, or too late)."""
    cursor = conn.execute(
        "UPDATE site_calls SET status = 'answered', result = ?, answered_at = ? WHERE id = ? AND status = 'pending'",
        (json.dumps(result), iso(at), call_id),
    )
    return cursor.rowcount == 1


def give_up(conn: sqlite3.Connection, call_id: str, *, at: datetime) -> bool:
    """No answer by the deadline: stop sending it; False when it was answered meanwhile."""
    cursor = conn.execute(
        "UPDATE site_calls SET status = 'gave_up', answered_at = ? WHERE id = ? AND status = 'pending'",
        (iso(at), call_id),
    )
    return cursor.rowcount == 1


def forget_old(conn: sqlite3.Connection, *, now: datetime) -> int:
    """Delete the finished calls older than KEEP_DAYS."""
    cursor = conn.execute(
        "DELETE FROM site_calls WHERE status != 'pending' AND answered_at < ?",
        (iso(now - timedelta(days=KEEP_DAYS)),),
    )
    return cursor.rowcount


def _row(row: sqlite3.Row) -> SiteCall:
    deadline = parse_iso(row["deadline"])
    assert deadline is not None
    return SiteCall(
        id=row["id"],
        group_folder=row["group_folder"],
        request_id=row["request_id"],
        target=row["target"],
        message=row["message"],
        deadline=deadline,
        status=row["status"],
        sends=row["sends"],
        result=json.loads(row["result"]) if row["result"] else None,
    )
