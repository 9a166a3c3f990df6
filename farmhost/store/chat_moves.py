"""A chat that Telegram gave a new id (a group upgraded to a supergroup): its rows follow it to the new jid.

The registration, the transcript (context and `memory_search`), what its agent was given, undelivered outbox
entries, open alert notices, triggered messages still running and updates waiting for a voice note all move in
the caller's transaction; the update log and what was sent already keep the id they were written under.
"""

from __future__ import annotations

import sqlite3

from farmhost.store import groups


def move_chat(conn: sqlite3.Connection, old_jid: str, new_jid: str) -> groups.Group | None:
    """Move the group registered for `old_jid` to `new_jid`; returns it as moved, None when nothing moved.

    Nothing moves when `old_jid` is not registered or `new_jid` is already (the operator registered the new id
    himself: his registration stands).
    """
    group = groups.find_by_jid(conn, old_jid)
    if group is None or groups.find_by_jid(conn, new_jid) is not None:
        return None
    conn.execute("UPDATE groups SET jid = ? WHERE folder = ?", (new_jid, group.folder))
    # Rows the new id has already (a message there came first) win; the old id's duplicates are dropped.
    for table, column in (("chats", "jid"), ("chat_notices", "chat_jid")):
        conn.execute(f"UPDATE OR IGNORE {table} SET {column} = ? WHERE {column} = ?", (new_jid, old_jid))
        conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (old_jid,))
    conn.execute(
        "INSERT INTO chat_context (chat_jid, consumed_through) SELECT ?, consumed_through FROM chat_context"
        " WHERE chat_jid = ? ON CONFLICT(chat_jid) DO UPDATE SET"
        " consumed_through = max(consumed_through, excluded.consumed_through)",
        (new_jid, old_jid),
    )
    conn.execute("DELETE FROM chat_context WHERE chat_jid = ?", (old_jid,))
    conn.execute("UPDATE OR IGNORE transcript SET chat_jid = ? WHERE chat_jid = ?", (new_jid, old_jid))
    conn.execute("UPDATE outbox SET chat_jid = ? WHERE chat_jid = ? AND status = 'pending'", (new_jid, old_jid))
    conn.execute(
        "UPDATE OR IGNORE alert_notices SET chat_jid = ? WHERE chat_jid = ? AND status != 'closed'", (new_jid, old_jid)
    )
    conn.execute(
        "UPDATE telegram_updates SET chat_jid = ? WHERE chat_jid = ? AND status = 'queued'", (new_jid, old_jid)
    )
    conn.execute("UPDATE telegram_deferred SET chat_jid = ? WHERE chat_jid = ?", (new_jid, old_jid))
    # An offer of the new id (someone addressed the bot there before the move was seen) is moot now.
    conn.execute("DELETE FROM pending_chats WHERE jid = ? AND status = 'pending'", (new_jid,))
    return groups.find_by_jid(conn, new_jid)
