"""The actuator_calls table: when each entity under a rate limit was last called, so limits survive a restart."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Final

from farmhost.store.db import iso, parse_iso

# Nothing older matters to a limit per hour; older rows are dropped when a call is recorded.
KEPT: Final = timedelta(hours=1)


def record(conn: sqlite3.Connection, entity_ids: Iterable[str], *, folder: str, at: datetime) -> None:
    """Count one call for each entity (and forget calls older than an hour)."""
    conn.execute("DELETE FROM actuator_calls WHERE called_at < ?", (iso(at - KEPT),))
    conn.executemany(
        "INSERT INTO actuator_calls (entity_id, called_at, group_folder) VALUES (?, ?, ?)",
        [(entity_id, iso(at), folder) for entity_id in entity_ids],
    )


def since(conn: sqlite3.Connection, entity_id: str, start: datetime) -> tuple[int, datetime | None]:
    """How many calls reached `entity_id` since `start`, and when the latest one (ever kept) was."""
    count = conn.execute(
        "SELECT count(*) FROM actuator_calls WHERE entity_id = ? AND called_at >= ?", (entity_id, iso(start))
    ).fetchone()[0]
    latest = conn.execute("SELECT max(called_at) FROM actuator_calls WHERE entity_id = ?", (entity_id,)).fetchone()[0]
    return int(count), parse_iso(latest)
