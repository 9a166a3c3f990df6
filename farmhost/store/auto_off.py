"""The auto_off table: when farmhost turns each entity under a `maxOnSeconds` rule off, durably.

One row per time an entity was seen on (`on_since` is Home Assistant's `last_changed`): armed with its off
time, claimed by the watcher when it turns the entity off (once, like a scheduled task's run), then done; or
cancelled when the entity went off some other way. At most one row per entity is live (armed or claimed).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from farmhost.store.db import iso, parse_iso

Status = Literal["armed", "claimed", "done", "cancelled"]
LIVE: Final = ("armed", "claimed")


@dataclass(frozen=True, kw_only=True)
class AutoOffRow:
    """One on-period of an entity and when farmhost ends it."""

    entity_id: str
    on_since: datetime
    off_at: datetime
    max_on_seconds: int
    status: Status


def live(conn: sqlite3.Connection) -> dict[str, AutoOffRow]:
    """The armed and claimed rows, by entity."""
    rows = conn.execute("SELECT * FROM auto_off WHERE status IN ('armed', 'claimed')").fetchall()
    return {row["entity_id"]: _row(row) for row in rows}


def arm(conn: sqlite3.Connection, entity_id: str, *, on_since: datetime, off_at: datetime, max_on: int) -> bool:
    """Arm the off of this on-period (nothing when it is known already, finished or not); True when armed now."""
    cursor = conn.execute(
        "INSERT OR IGNORE INTO auto_off (entity_id, on_since, off_at, max_on_seconds, status) "
        "VALUES (?, ?, ?, ?, 'armed')",
        (entity_id, iso(on_since), iso(off_at), max_on),
    )
    return cursor.rowcount == 1


def tighten(conn: sqlite3.Connection, entity_id: str, *, off_at: datetime, max_on: int) -> None:
    """Bring an armed off time forward (a rule was made stricter); it is never pushed back."""
    conn.execute(
        "UPDATE auto_off SET off_at = ?, max_on_seconds = ? WHERE entity_id = ? AND status = 'armed' AND off_at > ?",
        (iso(off_at), max_on, entity_id, iso(off_at)),
    )


def cancel(conn: sqlite3.Connection, entity_id: str, *, at: datetime, outcome: str) -> None:
    """The entity's live row is not needed any more (it went off another way, or no rule covers it now)."""
    conn.execute(
        "UPDATE auto_off SET status = 'cancelled', finished_at = ?, outcome = ? "
        "WHERE entity_id = ? AND status IN ('armed', 'claimed')",
        (iso(at), outcome, entity_id),
    )


def claim_due(conn: sqlite3.Connection, entity_ids: set[str], *, at: datetime) -> list[AutoOffRow]:
    """Claim the armed rows of `entity_ids` whose off time has come (each is claimed by one watcher, once)."""
    rows = conn.execute(
        "SELECT * FROM auto_off WHERE status = 'armed' AND off_at <= ? ORDER BY off_at", (iso(at),)
    ).fetchall()
    claimed = [_row(row) for row in rows if row["entity_id"] in entity_ids]
    conn.executemany(
        "UPDATE auto_off SET status = 'claimed', claimed_at = ? WHERE entity_id = ? AND on_since = ?",
        [(iso(at), row.entity_id, iso(row.on_since)) for row in claimed],
    )
    return claimed


def finish(conn: sqlite3.Connection, row: AutoOffRow, *, at: datetime, outcome: str) -> None:
    """The entity was turned off."""
    conn.execute(
        "UPDATE auto_off SET status = 'done', finished_at = ?, outcome = ? WHERE entity_id = ? AND on_since = ?",
        (iso(at), outcome, row.entity_id, iso(row.on_since)),
    )


def release(conn: sqlite3.Connection, row: AutoOffRow) -> None:
    """Turning it off failed (Home Assistant away or refusing): armed again, tried at the next look."""
    conn.execute(
        "UPDATE auto_off SET status = 'armed', claimed_at = NULL WHERE entity_id = ? AND on_since = ? "
        "AND status = 'claimed'",
        (row.entity_id, iso(row.on_since)),
    )


def release_claims(conn: sqlite3.Connection) -> int:
    """At start: claims a stop interrupted are armed again (turning off twice is harmless; never turning off is not)."""
    return conn.execute("UPDATE auto_off SET status = 'armed', claimed_at = NULL WHERE status = 'claimed'").rowcount


def _row(row: sqlite3.Row) -> AutoOffRow:
    on_since = parse_iso(row["on_since"])
    off_at = parse_iso(row["off_at"])
    assert on_since is not None and off_at is not None  # NOT NULL columns
    return AutoOffRow(
        entity_id=row["entity_id"],
        on_since=on_since,
        off_at=off_at,
        max_on_seconds=int(row["max_on_seconds"]),
        status=row["status"],
    )
