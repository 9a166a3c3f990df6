"""The approvals table: one row per control action waiting for, or decided by, an approver in the chat.

A row moves pending -> approved -> done | failed, or pending -> denied | expired, each step a conditional
update so a second press, a replayed callback or two looks for expired approvals change nothing. `reported`
says whether the group's agent has been told the outcome in a run.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from farmhost.store.db import iso, parse_iso

Status = Literal["pending", "approved", "done", "failed", "denied", "expired"]
FINAL: Final = ("done", "failed", "denied", "expired")


@dataclass(frozen=True, kw_only=True)
class ApprovalRow:
    """One approval."""

    id: str
    group_folder: str
    request_id: str
    action: str
    params: dict[str, Any]
    call_hash: str
    summary: str  # what will happen, in words (entity, service, data)
    approvers: frozenset[int] | None  # None: any member of the main chat
    status: Status
    created_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    outcome: str | None = None  # what happened, in words


def pending_for(conn: sqlite3.Connection, folder: str, call_hash: str) -> ApprovalRow | None:
    """The pending approval of the same call from the same group, if any."""
    row = conn.execute(
        "SELECT * FROM approvals WHERE group_folder = ? AND call_hash = ? AND status = 'pending'", (folder, call_hash)
    ).fetchone()
    return _row(row) if row else None


def pending_of_group(conn: sqlite3.Connection, folder: str, at: datetime) -> list[ApprovalRow]:
    """The group's approvals still waiting for an approver at `at` (not past their time), oldest first."""
    rows = conn.execute(
        "SELECT * FROM approvals WHERE group_folder = ? AND status = 'pending' AND expires_at > ? ORDER BY created_at",
        (folder, iso(at)),
    ).fetchall()
    return [_row(row) for row in rows]


def all_pending(conn: sqlite3.Connection) -> list[ApprovalRow]:
    """Every pending approval of every group, oldest first (past their time too: the sweep has not expired them)."""
    rows = conn.execute("SELECT * FROM approvals WHERE status = 'pending' ORDER BY created_at").fetchall()
    return [_row(row) for row in rows]


def create(conn: sqlite3.Connection, approval: ApprovalRow) -> None:
    """Store a new pending approval."""
    conn.execute(
        "INSERT INTO approvals (id, group_folder, request_id, action, params, call_hash, summary, approvers, status,"
        " created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (
            approval.id,
            approval.group_folder,
            approval.request_id,
            approval.action,
            json.dumps(approval.params, sort_keys=True),
            approval.call_hash,
            approval.summary,
            json.dumps(sorted(approval.approvers)) if approval.approvers is not None else None,
            iso(approval.created_at),
            iso(approval.expires_at),
        ),
    )


def count_pending(conn: sqlite3.Connection) -> int:
    """How many approvals wait for an approver, in every group (past their time too, until the sweep)."""
    return int(conn.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").fetchone()[0])


def count_by_status_between(conn: sqlite3.Connection, start: datetime, end: datetime) -> dict[str, int]:
    """How many approvals asked for from `start` to `end` are in each status."""
    rows = conn.execute(
        "SELECT status, COUNT(*) FROM approvals WHERE created_at >= ? AND created_at <= ? GROUP BY status",
        (iso(start), iso(end)),
    ).fetchall()
    return {str(status): int(n) for status, n in rows}


def get(conn: sqlite3.Connection, approval_id: str) -> ApprovalRow | None:
    """One approval by id."""
    row = conn.execute("SELECT * FROM approvals WHERE id = ?", (approval_id,)).fetchone()
    return _row(row) if row else None


def decide(
    conn: sqlite3.Connection, approval_id: str, *, status: Status, by: str, at: datetime, outcome: str | None = None
) -> bool:
    """Move pending to approved or denied, only while it has not expired; False when it was not pending any more."""
    cursor = conn.execute(
        "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?, outcome = ? WHERE id = ?"
        " AND status = 'pending' AND expires_at > ?",
        (status, by, iso(at), outcome, approval_id, iso(at)),
    )
    return cursor.rowcount == 1


def finish(conn: sqlite3.Connection, approval_id: str, *, status: Status, outcome: str) -> bool:
    """Move approved to done or failed, with what happened; False when it was not approved (already finished)."""
    cursor = conn.execute(
        "UPDATE approvals SET status = ?, outcome = ? WHERE id = ? AND status = 'approved'",
        (status, outcome, approval_id),
    )
    return cursor.rowcount == 1


# Pending past its time, or expired by `lapse` and not yet told (no outcome).
_DUE: Final = "(status = 'pending' AND expires_at <= ?) OR (status = 'expired' AND outcome IS NULL)"


def expire_due(conn: sqlite3.Connection, at: datetime) -> list[ApprovalRow]:
    """Mark every pending approval past its time expired (and finish lapsed ones); returns them, each once ever."""
    rows = conn.execute(f"SELECT * FROM approvals WHERE {_DUE} ORDER BY created_at", (iso(at),)).fetchall()
    conn.execute(f"UPDATE approvals SET status = 'expired', outcome = 'nobody approved it in time' WHERE {_DUE}",
                 (iso(at),))  # fmt: skip
    return [_row(row) for row in rows]


def next_due(conn: sqlite3.Connection) -> datetime | None:
    """When `expire_due` next has something to do: the earliest pending expiry, or any time now (a lapsed one)."""
    lapsed = conn.execute("SELECT 1 FROM approvals WHERE status = 'expired' AND outcome IS NULL LIMIT 1").fetchone()
    if lapsed is not None:
        return datetime.min.replace(tzinfo=UTC)
    earliest = conn.execute("SELECT MIN(expires_at) FROM approvals WHERE status = 'pending'").fetchone()[0]
    return parse_iso(earliest)


def lapse(conn: sqlite3.Connection, approval_id: str) -> None:
    """Expire one pending approval past its time, leaving its outcome to the desk's next sweep (which tells it)."""
    conn.execute("UPDATE approvals SET status = 'expired' WHERE id = ? AND status = 'pending'", (approval_id,))


def approved_unfinished(conn: sqlite3.Connection) -> list[ApprovalRow]:
    """Approved rows whose execution never finished (the host stopped or crashed during it)."""
    rows = conn.execute("SELECT * FROM approvals WHERE status = 'approved' ORDER BY decided_at").fetchall()
    return [_row(row) for row in rows]


def take_unreported(conn: sqlite3.Connection, folder: str) -> list[ApprovalRow]:
    """The group's decided approvals its agent has not been told about yet, now marked as told."""
    marks = ",".join("?" * len(FINAL))
    rows = conn.execute(
        f"SELECT * FROM approvals WHERE group_folder = ? AND reported = 0 AND status IN ({marks}) ORDER BY created_at",
        (folder, *FINAL),
    ).fetchall()
    conn.executemany("UPDATE approvals SET reported = 1 WHERE id = ?", [(row["id"],) for row in rows])
    return [_row(row) for row in rows]


def _row(row: sqlite3.Row) -> ApprovalRow:
    created, expires = parse_iso(row["created_at"]), parse_iso(row["expires_at"])
    assert created is not None and expires is not None
    approvers = row["approvers"]
    return ApprovalRow(
        id=row["id"],
        group_folder=row["group_folder"],
        request_id=row["request_id"],
        action=row["action"],
        params=json.loads(row["params"]),
        call_hash=row["call_hash"],
        summary=row["summary"],
        approvers=frozenset(json.loads(approvers)) if approvers is not None else None,
        status=row["status"],
        created_at=created,
        expires_at=expires,
        decided_by=row["decided_by"],
        decided_at=parse_iso(row["decided_at"]),
        outcome=row["outcome"],
    )
