"""The transcript table: every message that passes through farmhost, searchable as the group's sessions.

Rows are only ever inserted (an edit is a new row): nothing in farmhost updates or deletes one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from farmhost.store.db import iso, parse_iso

Direction = Literal["in", "out"]
# How much of a chat's history memory_search looks at: recent enough to matter, small enough to keep indexed.
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


class MessageRow(NamedTuple):
    """A transcript row as memory_search indexes it: `sent_at` is the stored text (`iso`), not parsed."""

    id: int
    chat_jid: str
    direction: Direction
    sender: str | None
    text: str
    sent_at: str


_ROW_COLUMNS = "id, chat_jid, direction, sender, text, sent_at"


def _marks(chat_jids: Sequence[str]) -> str:
    return ",".join("?" * len(chat_jids))


def latest(conn: sqlite3.Connection, chat_jids: Sequence[str], *, limit: int = RECENT_LIMIT) -> list[MessageRow]:
    """The latest `limit` messages of these chats, oldest first."""
    if not chat_jids:
        return []
    rows = conn.execute(
        f"SELECT * FROM (SELECT {_ROW_COLUMNS} FROM transcript WHERE chat_jid IN ({_marks(chat_jids)})"
        " ORDER BY id DESC LIMIT ?) ORDER BY id",
        (*chat_jids, limit),
    )
    return [MessageRow(*row) for row in rows]


def since(conn: sqlite3.Connection, chat_jids: Sequence[str], after_id: int, *, limit: int) -> list[MessageRow]:
    """At most `limit` messages of these chats with an id above `after_id`, oldest first (an index range)."""
    if not chat_jids:
        return []
    rows = conn.execute(
        f"SELECT {_ROW_COLUMNS} FROM transcript WHERE chat_jid IN ({_marks(chat_jids)}) AND id > ? ORDER BY id LIMIT ?",
        (*chat_jids, after_id, limit),
    )
    return [MessageRow(*row) for row in rows]


def count_between(conn: sqlite3.Connection, chat_jids: Sequence[str], first_id: int, last_id: int) -> int:
    """How many messages of these chats have an id in [first_id, last_id] (counted on the index, no row read)."""
    if not chat_jids:
        return 0
    row = conn.execute(
        f"SELECT count(*) FROM transcript WHERE chat_jid IN ({_marks(chat_jids)}) AND id BETWEEN ? AND ?",
        (*chat_jids, first_id, last_id),
    ).fetchone()
    return int(row[0])


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
