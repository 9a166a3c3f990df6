"""The chats table: every chat the bot has seen, registered or not, with its last activity."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

from farmhost.store.db import iso, parse_iso


@dataclass(frozen=True, kw_only=True)
class Chat:
    """A chat known to the host."""

    jid: str
    name: str | None
    channel: str
    last_activity: datetime | None


def upsert_chat(conn: sqlite3.Connection, *, jid: str, name: str | None, channel: str, seen_at: datetime) -> None:
    """Record activity in a chat."""
    conn.execute(
        "INSERT INTO chats (jid, name, channel, last_activity) VALUES (?, ?, ?, ?)"
        " ON CONFLICT(jid) DO UPDATE SET name = coalesce(excluded.name, name),"
        " last_activity = max(coalesce(last_activity, ''), excluded.last_activity)",
        (jid, name, channel, iso(seen_at)),
    )


def list_chats(conn: sqlite3.Connection) -> list[Chat]:
    """All known chats, most recently active first."""
    rows = conn.execute("SELECT * FROM chats ORDER BY last_activity DESC, jid")
    return [
        Chat(jid=r["jid"], name=r["name"], channel=r["channel"], last_activity=parse_iso(r["last_activity"]))
        for r in rows
    ]
