"""The durable outbox: every chunk the host must deliver, with its attempts and outcome."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from farmhost.store.db import iso, parse_iso

logger = logging.getLogger(__name__)

OutboxKind = Literal["text", "file"]
# Options that belong to the message as a whole go with its last chunk only (a keyboard under chunk 1 of 3
# would sit in the middle of the message).
LAST_CHUNK_OPTIONS: Final = frozenset({"reply_markup"})
# Which pending entry of a chat (table alias `o`) goes next (see `chat_head`): an agent's message whose first
# chunk is not sent yet waits while the host has anything to say; a message under way, and the host's own, keep
# their places by id.
_HEAD_ORDER: Final = (
    "(o.source_folder IS NOT NULL AND NOT EXISTS (SELECT 1 FROM outbox AS begun WHERE begun.message_key ="
    " o.message_key AND begun.chunk_index = 0 AND begun.status = 'sent')), o.id"
)


@dataclass(frozen=True, kw_only=True)
class OutboxEntry:
    """One chunk (or file) waiting for, or done with, delivery."""

    id: int
    message_key: str
    chunk_index: int
    chunk_count: int
    chat_jid: str
    source_folder: str | None
    kind: OutboxKind
    body: str | None
    file_path: str | None
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None
    next_attempt_at: datetime | None = None
    options: dict[str, Any] = field(default_factory=dict)
    telegram_message_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view for `farmhost outbox list --json`."""
        return {
            "id": self.id,
            "messageKey": self.message_key,
            "chunk": f"{self.chunk_index + 1}/{self.chunk_count}",
            "chatJid": self.chat_jid,
            "sourceFolder": self.source_folder,
            "kind": self.kind,
            "body": self.body,
            "filePath": self.file_path,
            "status": self.status,
            "attempts": self.attempts,
            "lastError": self.last_error,
            "createdAt": iso(self.created_at),
            "nextAttemptAt": iso(self.next_attempt_at) if self.status == "pending" else None,
            "sentAt": iso(self.sent_at),
            "telegramMessageId": self.telegram_message_id,
            "options": self.options,
        }


def enqueue(
    conn: sqlite3.Connection,
    *,
    message_key: str,
    chat_jid: str,
    source_folder: str | None,
    chunks: list[str],
    at: datetime,
    kind: OutboxKind = "text",
    file_path: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> int:
    """Queue a message as its chunks (a file is one entry whose body is the caption); returns the count.

    Args:
        conn: The connection, inside the caller's transaction.
        message_key: Unique per message; chunk i of it is `(message_key, i)`.
        chat_jid: The target chat (`telegram:<chat id>`).
        source_folder: The group that asked for it, None for the host's own messages.
        chunks: The text chunks in order, already Telegram-sized (see `farmhost.outbox.chunking`).
        at: Now; the chunks are due at once.
        kind: `text`, or `file` (then `file_path` is the host's private copy).
        file_path: The file to send, for `kind="file"`.
        options: Delivery options (JSON): `reply_markup` (an inline keyboard, attached to the last chunk only),
            `format` (`plain` sends the text as is; absent or `html` converts the agent's markdown to HTML),
            `file_name` (the name a file is sent under), `reply_to_key` (the message key of an earlier message
            to the chat: sent as a reply to it, or as a plain message when that one was never sent).

    Raises:
        sqlite3.IntegrityError: `message_key` was queued before.
    """
    shared = {k: v for k, v in (options or {}).items() if k not in LAST_CHUNK_OPTIONS}
    for index, body in enumerate(chunks):
        chunk_options = dict(options or {}) if index == len(chunks) - 1 else shared
        conn.execute(
            "INSERT INTO outbox (message_key, chunk_index, chunk_count, chat_jid, source_folder, kind, body,"
            " file_path, created_at, next_attempt_at, options) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                message_key,
                index,
                len(chunks),
                chat_jid,
                source_folder,
                kind,
                body,
                file_path,
                iso(at),
                iso(at),
                json.dumps(chunk_options) if chunk_options else None,
            ),
        )
    return len(chunks)


def list_entries(conn: sqlite3.Connection, *, status: str | None = None, limit: int = 200) -> list[OutboxEntry]:
    """Outbox entries, oldest first, optionally of one status."""
    rows = conn.execute(
        "SELECT * FROM outbox WHERE (? IS NULL OR status = ?) ORDER BY id LIMIT ?", (status, status, limit)
    )
    return [_entry(row) for row in rows]


def get_entry(conn: sqlite3.Connection, entry_id: int) -> OutboxEntry | None:
    """One entry by id."""
    row = conn.execute("SELECT * FROM outbox WHERE id = ?", (entry_id,)).fetchone()
    return None if row is None else _entry(row)


def chat_heads(conn: sqlite3.Connection) -> list[OutboxEntry]:
    """The head of each chat (`chat_head`): the only entry of that chat that may go next."""
    rows = conn.execute(
        "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY chat_jid ORDER BY"
        f" {_HEAD_ORDER}) AS place FROM outbox AS o WHERE o.status = 'pending') WHERE place = 1 ORDER BY id"
    )
    return [_entry(row) for row in rows]


def chat_head(conn: sqlite3.Connection, chat_jid: str) -> OutboxEntry | None:
    """The entry of one chat that goes next.

    The oldest, except that the host's own messages (farm alerts, approvals, notices) go ahead of agents'
    messages not yet begun. An agent may queue hours of Telegram's per-chat rate in a chat (main: the main
    chat); an alert or an approval must not wait behind that. The agent message under way is finished first,
    and each side keeps its own order.
    """
    row = conn.execute(
        f"SELECT * FROM outbox AS o WHERE o.status = 'pending' AND o.chat_jid = ? ORDER BY {_HEAD_ORDER} LIMIT 1",
        (chat_jid,),
    ).fetchone()
    return None if row is None else _entry(row)


def has_key(conn: sqlite3.Connection, message_key: str) -> bool:
    """Whether a message with `message_key` was ever queued (to any chat, in any status)."""
    return conn.execute("SELECT 1 FROM outbox WHERE message_key = ? LIMIT 1", (message_key,)).fetchone() is not None


def sent_message_id(conn: sqlite3.Connection, message_key: str, chat_jid: str) -> int | None:
    """Telegram's id of the first chunk of message `message_key` to `chat_jid`, once it was sent (else None)."""
    row = conn.execute(
        "SELECT telegram_message_id FROM outbox WHERE message_key = ? AND chat_jid = ? AND status = 'sent'"
        " ORDER BY chunk_index LIMIT 1",
        (message_key, chat_jid),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def mark_sent(conn: sqlite3.Connection, entry_id: int, *, telegram_message_id: int | None, at: datetime) -> bool:
    """Record a confirmed send; False when the entry was not pending (nothing changed)."""
    cursor = conn.execute(
        "UPDATE outbox SET status = 'sent', sent_at = ?, telegram_message_id = ?, next_attempt_at = NULL"
        " WHERE id = ? AND status = 'pending'",
        (iso(at), telegram_message_id, entry_id),
    )
    return cursor.rowcount == 1


def schedule_retry(
    conn: sqlite3.Connection, entry_id: int, *, next_attempt_at: datetime, error: str, count_attempt: bool
) -> None:
    """Keep the entry pending until `next_attempt_at`, remembering the error (and counting the attempt)."""
    conn.execute(
        "UPDATE outbox SET next_attempt_at = ?, last_error = ?, attempts = attempts + ? WHERE id = ? AND status = 'pending'",
        (iso(next_attempt_at), error, 1 if count_attempt else 0, entry_id),
    )


def mark_failed(conn: sqlite3.Connection, entry: OutboxEntry, *, error: str, count_attempt: bool = True) -> int:
    """Give up on an entry, and on the later chunks of its message (sent alone they would make no sense).

    Returns:
        How many entries were marked failed.
    """
    conn.execute(
        "UPDATE outbox SET status = 'failed', last_error = ?, attempts = attempts + ?, next_attempt_at = NULL"
        " WHERE id = ? AND status = 'pending'",
        (error, 1 if count_attempt else 0, entry.id),
    )
    rest = conn.execute(
        "UPDATE outbox SET status = 'failed', last_error = ?, next_attempt_at = NULL"
        " WHERE message_key = ? AND chunk_index > ? AND status = 'pending'",
        (
            f"chunk {entry.chunk_index + 1}/{entry.chunk_count} of this message failed: {error}",
            entry.message_key,
            entry.chunk_index,
        ),
    )
    return 1 + rest.rowcount


def fail_pending_from(conn: sqlite3.Connection, source_folder: str, *, error: str) -> int:
    """Give up on every entry one group queued that is not sent yet (the group was removed); how many."""
    return conn.execute(
        "UPDATE outbox SET status = 'failed', last_error = ?, next_attempt_at = NULL"
        " WHERE status = 'pending' AND source_folder = ?",
        (error, source_folder),
    ).rowcount


def set_options(conn: sqlite3.Connection, entry_id: int, options: Mapping[str, Any]) -> None:
    """Replace an entry's delivery options (e.g. to remember that it goes as plain text from now on)."""
    conn.execute(
        "UPDATE outbox SET options = ? WHERE id = ?", (json.dumps(dict(options)) if options else None, entry_id)
    )


def count_by_status(conn: sqlite3.Connection) -> dict[str, int]:
    """Outbox size per status."""
    return {row[0]: row[1] for row in conn.execute("SELECT status, count(*) FROM outbox GROUP BY status")}


def count_pending_from(conn: sqlite3.Connection, source_folder: str) -> int:
    """How many entries one group queued that are not delivered yet (the pending-status index keeps it short)."""
    row = conn.execute(
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND source_folder = ?", (source_folder,)
    ).fetchone()
    return int(row[0])


def count_pending_since(conn: sqlite3.Connection, before: datetime) -> int:
    """How many entries are still pending that were queued before `before`."""
    row = conn.execute(
        "SELECT count(*) FROM outbox WHERE status = 'pending' AND created_at < ?", (iso(before),)
    ).fetchone()
    return int(row[0])


def _options(entry_id: int, text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        logger.warning("outbox entry %d has unreadable options %r; sending without them", entry_id, text[:200])
        return {}
    return value


def _entry(row: sqlite3.Row) -> OutboxEntry:
    created = parse_iso(row["created_at"])
    assert created is not None
    return OutboxEntry(
        id=row["id"],
        message_key=row["message_key"],
        chunk_index=row["chunk_index"],
        chunk_count=row["chunk_count"],
        chat_jid=row["chat_jid"],
        source_folder=row["source_folder"],
        kind=row["kind"],
        body=row["body"],
        file_path=row["file_path"],
        status=row["status"],
        attempts=row["attempts"],
        last_error=row["last_error"],
        created_at=created,
        sent_at=parse_iso(row["sent_at"]),
        next_attempt_at=parse_iso(row["next_attempt_at"]),
        options=_options(row["id"], row["options"]),
        telegram_message_id=row["telegram_message_id"],
    )
