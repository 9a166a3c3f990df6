"""The durable outbox: every chunk the host must deliver, with its attempts and outcome."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from farmhost.store.db import iso, parse_iso

OutboxKind = Literal["text", "file"]


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
            "sentAt": iso(self.sent_at),
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
) -> int:
    """Queue a message as its chunks (a file is one entry whose body is the caption); returns the count."""
    for index, body in enumerate(chunks):
        conn.execute(
            "INSERT INTO outbox (message_key, chunk_index, chunk_count, chat_jid, source_folder, kind, body,"
            " file_path, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (message_key, index, len(chunks), chat_jid, source_folder, kind, body, file_path, iso(at), iso(at)),
        )
    return len(chunks)


def list_entries(conn: sqlite3.Connection, *, status: str | None = None, limit: int = 200) -> list[OutboxEntry]:
    """Outbox entries, oldest first, optionally of one status."""
    rows = conn.execute(
        "SELECT * FROM outbox WHERE (? IS NULL OR status = ?) ORDER BY id LIMIT ?", (status, status, limit)
    )
    return [_entry(row) for row in rows]


def count_by_status(conn: sqlite3.Connection) -> dict[str, int]:
    """Outbox size per status."""
    return {row[0]: row[1] for row in conn.execute("SELECT status, count(*) FROM outbox GROUP BY status")}


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
    )
