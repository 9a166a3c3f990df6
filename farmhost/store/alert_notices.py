"""The alert_notices table: farm alerts told to chats, their repeats, acknowledgements and resolution lines."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from farmhost.store.db import iso, parse_iso

# held: not told yet (a warning in quiet hours); open: told, `due_at` is the next repeat or the snooze's end;
# resolving: the alert is gone, its resolution line goes at `due_at` unless it returns first; closed: done.
NoticeStatus = Literal["held", "open", "resolving", "closed"]


@dataclass(frozen=True, kw_only=True)
class AlertNotice:
    """One alert occurrence as told (or to be told) to one chat."""

    id: int
    subject: str
    chat_jid: str
    alert_id: str
    rule: str
    entity_id: str
    severity: str
    text: str
    since: datetime
    status: NoticeStatus
    due_at: datetime | None
    sends: int
    acked_by: str | None
    acked_at: datetime | None
    resolved_at: datetime | None


def live(conn: sqlite3.Connection) -> list[AlertNotice]:
    """Every notice not closed, oldest first."""
    rows = conn.execute("SELECT * FROM alert_notices WHERE status != 'closed' ORDER BY id")
    return [_notice(row) for row in rows]


def get(conn: sqlite3.Connection, notice_id: int) -> AlertNotice | None:
    """One notice by id."""
    row = conn.execute("SELECT * FROM alert_notices WHERE id = ?", (notice_id,)).fetchone()
    return None if row is None else _notice(row)


def exists(conn: sqlite3.Connection, subject: str, chat_jid: str) -> bool:
    """Whether the chat has ever had a notice of this subject (closed ones included)."""
    row = conn.execute(
        "SELECT 1 FROM alert_notices WHERE subject = ? AND chat_jid = ? LIMIT 1", (subject, chat_jid)
    ).fetchone()
    return row is not None


def add(
    conn: sqlite3.Connection,
    *,
    subject: str,
    chat_jid: str,
    alert_id: str,
    rule: str,
    entity_id: str,
    severity: str,
    text: str,
    since: datetime,
    due_at: datetime,
    at: datetime,
) -> int:
    """Record a new alert for a chat, `held` until `due_at` (now: told at the next look); returns its id.

    Raises:
        sqlite3.IntegrityError: the chat has a notice of this subject that is not closed.
    """
    cursor = conn.execute(
        "INSERT INTO alert_notices (subject, chat_jid, alert_id, rule, entity_id, severity, text, since, status,"
        " due_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'held', ?, ?)",
        (subject, chat_jid, alert_id, rule, entity_id, severity, text, iso(since), iso(due_at), iso(at)),
    )
    return int(cursor.lastrowid or 0)


def update(conn: sqlite3.Connection, notice_id: int, *, alert_id: str, severity: str, text: str) -> None:
    """The alert is still (or again) active: keep its latest occurrence id, severity and words."""
    conn.execute(
        "UPDATE alert_notices SET alert_id = ?, severity = ?, text = ? WHERE id = ?",
        (alert_id, severity, text, notice_id),
    )


def postpone(conn: sqlite3.Connection, notice_id: int, *, due_at: datetime | None) -> None:
    """Move the notice's next step to `due_at` (None: no next step until something happens)."""
    conn.execute("UPDATE alert_notices SET due_at = ? WHERE id = ?", (iso(due_at), notice_id))


def reopen(conn: sqlite3.Connection, notice_id: int, *, due_at: datetime | None) -> None:
    """The alert came back while its resolution line waited: it is the same alert, told already."""
    conn.execute(
        "UPDATE alert_notices SET status = 'open', resolved_at = NULL, due_at = ? WHERE id = ? AND status = 'resolving'",
        (iso(due_at), notice_id),
    )


def resolving(conn: sqlite3.Connection, notice_id: int, *, resolved_at: datetime, due_at: datetime) -> None:
    """The alert is gone: its resolution line is due at `due_at` (the end of the flap window)."""
    conn.execute(
        "UPDATE alert_notices SET status = 'resolving', resolved_at = ?, due_at = ? WHERE id = ? AND status = 'open'",
        (iso(resolved_at), iso(due_at), notice_id),
    )


def told(conn: sqlite3.Connection, notice_id: int, *, sends: int, due_at: datetime | None) -> None:
    """The alert's message number `sends` was queued; the next one (a repeat) is due at `due_at`, None: never."""
    conn.execute(
        "UPDATE alert_notices SET status = 'open', sends = ?, due_at = ? WHERE id = ? AND status IN ('held', 'open')",
        (sends, iso(due_at), notice_id),
    )


def close(conn: sqlite3.Connection, notice_id: int) -> None:
    """Nothing more is told of this notice."""
    conn.execute("UPDATE alert_notices SET status = 'closed', due_at = NULL WHERE id = ?", (notice_id,))


def acknowledge(conn: sqlite3.Connection, notice_id: int, *, by: str, at: datetime) -> bool:
    """Record who acknowledged the alert (no more repeats); False when it was acknowledged before."""
    cursor = conn.execute(
        "UPDATE alert_notices SET acked_by = ?, acked_at = ?,"
        " due_at = CASE WHEN status = 'open' THEN NULL ELSE due_at END WHERE id = ? AND acked_by IS NULL",
        (by, iso(at), notice_id),
    )
    return cursor.rowcount == 1


def snooze(conn: sqlite3.Connection, notice_id: int, *, until: datetime) -> bool:
    """The alert is told again at `until` if it is still active then; False when it is not open."""
    cursor = conn.execute(
        "UPDATE alert_notices SET due_at = ? WHERE id = ? AND status = 'open'", (iso(until), notice_id)
    )
    return cursor.rowcount == 1


def due(conn: sqlite3.Connection, now: datetime) -> list[AlertNotice]:
    """The notices whose next step (first message, repeat, resolution line) is due at `now`, oldest first."""
    rows = conn.execute(
        "SELECT * FROM alert_notices WHERE status IN ('held', 'open', 'resolving') AND due_at <= ? ORDER BY id",
        (iso(now),),
    )
    return [_notice(row) for row in rows]


def next_due(conn: sqlite3.Connection) -> datetime | None:
    """When the next step of any notice is due (None: none is)."""
    row = conn.execute(
        "SELECT min(due_at) FROM alert_notices WHERE status IN ('held', 'open', 'resolving') AND due_at IS NOT NULL"
    ).fetchone()
    return parse_iso(row[0]) if row is not None else None


def _notice(row: sqlite3.Row) -> AlertNotice:
    since = parse_iso(row["since"])
    assert since is not None
    return AlertNotice(
        id=row["id"],
        subject=row["subject"],
        chat_jid=row["chat_jid"],
        alert_id=row["alert_id"],
        rule=row["rule"],
        entity_id=row["entity_id"],
        severity=row["severity"],
        text=row["text"],
        since=since,
        status=row["status"],
        due_at=parse_iso(row["due_at"]),
        sends=row["sends"],
        acked_by=row["acked_by"],
        acked_at=parse_iso(row["acked_at"]),
        resolved_at=parse_iso(row["resolved_at"]),
    )
