"""The agent_ids table: each group's host uid, allocated once from a range and never given to another group."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime

from farmhost.errors import FarmhostError
from farmhost.store.db import iso


class IdRangeExhausted(FarmhostError):
    """Every id of the configured range is allocated or taken by the host."""


def lookup(conn: sqlite3.Connection, folder: str) -> int | None:
    """The uid allocated to `folder`, None when it has none yet."""
    row = conn.execute("SELECT uid FROM agent_ids WHERE folder = ?", (folder,)).fetchone()
    return None if row is None else int(row[0])


def allocated(conn: sqlite3.Connection) -> dict[str, int]:
    """Every allocation, folder to uid (groups removed since included: their ids stay theirs)."""
    return {str(row[0]): int(row[1]) for row in conn.execute("SELECT folder, uid FROM agent_ids ORDER BY uid")}


def allocate(
    conn: sqlite3.Connection, folder: str, *, base: int, count: int, taken: Callable[[int], bool], now: datetime
) -> int:
    """The uid of `folder`: its recorded one, else the next id of [base, base+count) past every recorded one.

    Ids only grow: one given up by a removed group is never handed out again. Ids `taken` by the host (a user,
    a group, a subordinate range) are skipped. Call it inside a write transaction.

    Raises:
        IdRangeExhausted: no id is left in the range.
    """
    known = lookup(conn, folder)
    if known is not None:
        return known
    row = conn.execute("SELECT MAX(uid) FROM agent_ids WHERE uid >= ? AND uid < ?", (base, base + count)).fetchone()
    candidate = base if row[0] is None else int(row[0]) + 1
    while candidate < base + count and taken(candidate):
        candidate += 1
    if candidate >= base + count:
        raise IdRangeExhausted(f"all {count} ids from {base} are allocated or used by the host")
    conn.execute("INSERT INTO agent_ids (folder, uid, allocated_at) VALUES (?, ?, ?)", (folder, candidate, iso(now)))
    return candidate
