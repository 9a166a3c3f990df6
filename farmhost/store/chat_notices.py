"""The chat_notices table: which one-time notices each chat has been given (stored with the message that gives it)."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from farmhost.store.db import iso


def give_once(conn: sqlite3.Connection, *, jid: str, notice: str, at: datetime) -> bool:
    """Record that `jid` is given `notice` now; False when it was given before (then say nothing).

    Call it in the transaction that queues the notice, so a notice is recorded exactly when it is queued.
    """
    cursor = conn.execute(
        "INSERT OR IGNORE INTO chat_notices (chat_jid, notice, given_at) VALUES (?, ?, ?)", (jid, notice, iso(at))
    )
    return cursor.rowcount == 1


def given(conn: sqlite3.Connection, jid: str) -> list[str]:
    """The notices `jid` has been given, oldest first."""
    rows = conn.execute("SELECT notice FROM chat_notices WHERE chat_jid = ? ORDER BY given_at, notice", (jid,))
    return [str(r["notice"]) for r in rows]
