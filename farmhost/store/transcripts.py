"""The transcript table: every message that passes through farmhost, searchable as the group's sessions."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from farmhost.store.db import iso, parse_iso

Direction = Literal["in", "out"]
# How much of a chat's history memory_search looks at: recent enough to matter, small enough to index per search.
RECENT_LIMIT = 5000


@dataclass(frozen=True, kw_only=True)
class TranscriptMessage:
    """One stored message."""

    id: int
    chat_jid: str
    direction: Direction
    sender: str | None
    text: str
    sent_at: datetime


def append(
    conn: sqlite3.Connection,
    *,
    chat_jid: str,
    direction: Direction,
    sender: str | None,
    text: str,
    at: datetime,
    message_key: str | None = None,
) -> int | None:
    """Store a message; a repeated (chat, message_key) is ignored. Returns its id, or None when it was a repeat."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO transcript (chat_jid, direction, sender, text, sent_at, message_key)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (chat_jid, direction, sender, text, iso(at), message_key),
    )
    return cursor.lastrowid if cursor.rowcount else None


def recent(conn: sqlite3.Connection, chat_jids: Sequence[str], *, limit: int = RECENT_LIMIT) -> list[TranscriptMessage]:
    """The latest `limit` messages of these chats, oldest first."""
    if not chat_jids:
        return []
    marks = ",".join("?" * len(chat_jids))
    rows = conn.execute(
        f"SELECT * FROM (SELECT * FROM transcript WHERE chat_jid IN ({marks}) ORDER BY id DESC LIMIT ?) ORDER BY id",
        (*chat_jids, limit),
    )
    return [message_from_row(row) for row in rows]


def message_from_row(row: sqlite3.Row) -> TranscriptMessage:
    """A `transcript` row as a TranscriptMessage."""
    sent = parse_iso(row["sent_at"])
    assert sent is not None
    return TranscriptMessage(
        id=row["id"],
        chat_jid=row["chat_jid"],
        direction=row["direction"],
        sender=row["sender"],
        text=row["text"],
        sent_at=sent,
    )
