"""Telegram polling state: update ids seen, deferred updates, the polling offset, chat context, pending chats."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from farmhost.store import host_state
from farmhost.store.db import iso, parse_iso
from farmhost.store.transcripts import TranscriptMessage, message_from_row

OFFSET_KEY: Final = "telegram_offset"

# What became of an update. `queued` is the only unfinished one: a triggered message whose agent run has not
# ended yet (its detail says which transcript row triggered it, from where its context starts, and how many
# times it was submitted); at start every `queued` row is run (again).
UpdateStatus = Literal[
    "stored", "queued", "done", "failed", "ignored", "refused", "offered", "command", "callback", "error"
]
PendingStatus = Literal["pending", "approved", "rejected"]


@dataclass(frozen=True, kw_only=True)
class QueuedRun:
    """A triggered message whose agent run has not finished."""

    update_id: int
    chat_jid: str
    transcript_id: int
    context_after: int
    attempts: int


@dataclass(frozen=True, kw_only=True)
class PendingChat:
    """An unregistered chat offered to the main chat for approval."""

    jid: str
    title: str | None
    requested_by: str | None
    requested_at: datetime
    status: PendingStatus
    folder: str | None
    decided_at: datetime | None
    decided_by: str | None


# updates -------------------------------------------------------------------------------------------------


def seen(conn: sqlite3.Connection, update_id: int) -> bool:
    """Whether this update id was already processed."""
    return conn.execute("SELECT 1 FROM telegram_updates WHERE update_id = ?", (update_id,)).fetchone() is not None


def record_update(
    conn: sqlite3.Connection,
    *,
    update_id: int,
    chat_jid: str | None,
    status: UpdateStatus,
    detail: str | None,
    at: datetime,
) -> bool:
    """Record a processed update; returns False when the id was already there (a redelivery)."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO telegram_updates (update_id, chat_jid, received_at, status, detail)"
        " VALUES (?, ?, ?, ?, ?)",
        (update_id, chat_jid, iso(at), status, detail),
    )
    return cursor.rowcount > 0


def queue_run(
    conn: sqlite3.Connection, *, update_id: int, chat_jid: str, transcript_id: int, context_after: int, at: datetime
) -> None:
    """Record a triggered message whose agent run is still to happen."""
    detail = json.dumps({"transcript": transcript_id, "after": context_after, "attempts": 0})
    record_update(conn, update_id=update_id, chat_jid=chat_jid, status="queued", detail=detail, at=at)


def count_attempt(conn: sqlite3.Connection, run: QueuedRun) -> QueuedRun:
    """Note that the run is being submitted (once more); returns the run with the new count."""
    attempts = run.attempts + 1
    detail = json.dumps({"transcript": run.transcript_id, "after": run.context_after, "attempts": attempts})
    conn.execute(
        "UPDATE telegram_updates SET detail = ? WHERE update_id = ? AND status = 'queued'", (detail, run.update_id)
    )
    return QueuedRun(
        update_id=run.update_id,
        chat_jid=run.chat_jid,
        transcript_id=run.transcript_id,
        context_after=run.context_after,
        attempts=attempts,
    )


def finish_run(conn: sqlite3.Connection, update_id: int, *, status: Literal["done", "failed"], note: str) -> bool:
    """End a queued run; False when it was no longer queued (finished elsewhere)."""
    row = conn.execute("SELECT detail FROM telegram_updates WHERE update_id = ? AND status = 'queued'", (update_id,))
    found = row.fetchone()
    if found is None:
        return False
    detail: dict[str, Any] = json.loads(found[0])
    detail["note"] = note
    conn.execute(
        "UPDATE telegram_updates SET status = ?, detail = ? WHERE update_id = ?",
        (status, json.dumps(detail), update_id),
    )
    return True


def queued_runs(conn: sqlite3.Connection, update_id: int | None = None) -> list[QueuedRun]:
    """Triggered messages whose run has not finished (all, or the one of `update_id`), oldest first."""
    rows = conn.execute(
        "SELECT update_id, chat_jid, detail FROM telegram_updates WHERE status = 'queued'"
        " AND (? IS NULL OR update_id = ?) ORDER BY update_id",
        (update_id, update_id),
    )
    runs = []
    for row in rows:
        detail = json.loads(row["detail"])
        runs.append(
            QueuedRun(
                update_id=row["update_id"],
                chat_jid=row["chat_jid"],
                transcript_id=int(detail["transcript"]),
                context_after=int(detail["after"]),
                attempts=int(detail["attempts"]),
            )
        )
    return runs


def prune_updates(conn: sqlite3.Connection, *, older_than: datetime) -> int:
    """Forget finished updates received before `older_than` (Telegram never redelivers confirmed ones)."""
    cursor = conn.execute(
        "DELETE FROM telegram_updates WHERE status != 'queued' AND received_at < ?"
        " AND update_id < (SELECT max(update_id) FROM telegram_updates)",
        (iso(older_than),),
    )
    return cursor.rowcount


# deferred updates ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DeferredUpdate:
    """An update confirmed to Telegram whose handling waits for an earlier update of its chat."""

    update_id: int
    chat_jid: str
    raw: dict[str, Any]


def defer_update(conn: sqlite3.Connection, *, update_id: int, chat_jid: str, raw: dict[str, Any], at: datetime) -> bool:
    """Keep an update to handle later; False when it is kept already (a redelivery)."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO telegram_deferred (update_id, chat_jid, raw, deferred_at) VALUES (?, ?, ?, ?)",
        (update_id, chat_jid, json.dumps(raw), iso(at)),
    )
    return cursor.rowcount > 0


def deferred_updates(conn: sqlite3.Connection) -> list[DeferredUpdate]:
    """Every update still to handle, in update order."""
    rows = conn.execute("SELECT update_id, chat_jid, raw FROM telegram_deferred ORDER BY update_id")
    return [DeferredUpdate(update_id=r["update_id"], chat_jid=r["chat_jid"], raw=json.loads(r["raw"])) for r in rows]


def drop_deferred(conn: sqlite3.Connection, update_id: int) -> None:
    """Forget a deferred update once it is handled (its `telegram_updates` row then says what became of it)."""
    conn.execute("DELETE FROM telegram_deferred WHERE update_id = ?", (update_id,))


# the offset ------------------------------------------------------------------------------------------------


def get_offset(conn: sqlite3.Connection) -> int | None:
    """The next update id to ask Telegram for (None before the first update)."""
    value = host_state.get(conn, OFFSET_KEY)
    return int(value) if value is not None else None


def advance_offset(conn: sqlite3.Connection, update_id: int) -> int:
    """Confirm `update_id` (the offset becomes update_id + 1, never lower than it was); returns the offset."""
    current = get_offset(conn)
    offset = update_id + 1 if current is None else max(current, update_id + 1)
    host_state.put(conn, OFFSET_KEY, str(offset))
    return offset


# chat context ------------------------------------------------------------------------------------------------


def consumed_through(conn: sqlite3.Connection, chat_jid: str) -> int:
    """The last transcript id of the chat already given to an agent run (0: none)."""
    row = conn.execute("SELECT consumed_through FROM chat_context WHERE chat_jid = ?", (chat_jid,)).fetchone()
    return int(row[0]) if row else 0


def consume_through(conn: sqlite3.Connection, chat_jid: str, transcript_id: int) -> None:
    """Mark the chat's messages up to `transcript_id` as given to an agent run (never moves back)."""
    conn.execute(
        "INSERT INTO chat_context (chat_jid, consumed_through) VALUES (?, ?) ON CONFLICT(chat_jid)"
        " DO UPDATE SET consumed_through = max(consumed_through, excluded.consumed_through)",
        (chat_jid, transcript_id),
    )


def context_messages(
    conn: sqlite3.Connection, chat_jid: str, *, after: int, before: int, limit: int
) -> tuple[list[TranscriptMessage], int]:
    """The chat's inbound messages with after < id < before: the latest `limit`, oldest first, and how many more."""
    total = conn.execute(
        "SELECT count(*) FROM transcript WHERE chat_jid = ? AND direction = 'in' AND id > ? AND id < ?",
        (chat_jid, after, before),
    ).fetchone()[0]
    rows = conn.execute(
        "SELECT * FROM (SELECT * FROM transcript WHERE chat_jid = ? AND direction = 'in' AND id > ? AND id < ?"
        " ORDER BY id DESC LIMIT ?) ORDER BY id",
        (chat_jid, after, before, limit),
    ).fetchall()
    messages = [message_from_row(row) for row in rows]
    return messages, int(total) - len(messages)


def transcript_message(conn: sqlite3.Connection, transcript_id: int) -> TranscriptMessage | None:
    """One transcript row by id."""
    row = conn.execute("SELECT * FROM transcript WHERE id = ?", (transcript_id,)).fetchone()
    return message_from_row(row) if row else None


# pending chats --------------------------------------------------------------------------------------------------


def get_pending(conn: sqlite3.Connection, jid: str) -> PendingChat | None:
    """The approval request of a chat, whatever its status."""
    row = conn.execute("SELECT * FROM pending_chats WHERE jid = ?", (jid,)).fetchone()
    if row is None:
        return None
    requested = parse_iso(row["requested_at"])
    assert requested is not None
    return PendingChat(
        jid=row["jid"],
        title=row["title"],
        requested_by=row["requested_by"],
        requested_at=requested,
        status=row["status"],
        folder=row["folder"],
        decided_at=parse_iso(row["decided_at"]),
        decided_by=row["decided_by"],
    )


def count_waiting(conn: sqlite3.Connection, *, since: datetime) -> int:
    """How many chats asked since `since` and still wait for the operator's decision."""
    row = conn.execute(
        "SELECT count(*) FROM pending_chats WHERE status = 'pending' AND requested_at >= ?", (iso(since),)
    ).fetchone()
    return int(row[0])


def add_pending(
    conn: sqlite3.Connection, *, jid: str, title: str | None, requested_by: str | None, at: datetime
) -> None:
    """Record (or renew, after an approval whose group was removed since) a chat's request to be connected."""
    conn.execute(
        "INSERT INTO pending_chats (jid, title, requested_by, requested_at, status) VALUES (?, ?, ?, ?, 'pending')"
        " ON CONFLICT(jid) DO UPDATE SET title = excluded.title, requested_by = excluded.requested_by,"
        " requested_at = excluded.requested_at, status = 'pending', folder = NULL, decided_at = NULL,"
        " decided_by = NULL",
        (jid, title, requested_by, iso(at)),
    )


def decide_pending(
    conn: sqlite3.Connection,
    jid: str,
    *,
    status: Literal["approved", "rejected"],
    folder: str | None,
    by: str,
    at: datetime,
) -> bool:
    """Record the operator's decision on a pending chat; False when it was not pending."""
    cursor = conn.execute(
        "UPDATE pending_chats SET status = ?, folder = ?, decided_at = ?, decided_by = ?"
        " WHERE jid = ? AND status = 'pending'",
        (status, folder, iso(at), by, jid),
    )
    return cursor.rowcount > 0
