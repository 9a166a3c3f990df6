"""The host_state table: small named values the daemon keeps across restarts (agents paused, counters)."""

from __future__ import annotations

import sqlite3
from typing import Final

# Why agent runs are paused (the MQTT switch, /stop): "stopped by /stop (@ana, ...)"; absent while they run.
AGENTS_PAUSED: Final = "agents_paused"
# The live view of Home Assistant, as the daemon last saw it (JSON: connected, since, detail), for the doctor.
HA_LIVE_VIEW: Final = "ha_live_view"
# What the running daemon found of its agents' walls at start (JSON: pid, ids, cgroup), for the doctor: an operator's
# `farmhost doctor` runs as another user, in another cgroup, and would otherwise report what its own process could do.
AGENT_WALLS: Final = "agent_walls"


def get(conn: sqlite3.Connection, key: str) -> str | None:
    """The value of `key`, None when unset."""
    row = conn.execute("SELECT value FROM host_state WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def put(conn: sqlite3.Connection, key: str, value: str) -> None:
    """Set `key`."""
    conn.execute(
        "INSERT INTO host_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def delete(conn: sqlite3.Connection, key: str) -> None:
    """Unset `key`."""
    conn.execute("DELETE FROM host_state WHERE key = ?", (key,))


def increment(conn: sqlite3.Connection, key: str) -> int:
    """Add one to the counter `key` (0 when unset) and return it."""
    value = int(get(conn, key) or 0) + 1
    put(conn, key, str(value))
    return value


def forget_older(conn: sqlite3.Connection, prefix: str, key: str) -> None:
    """Unset the keys of `prefix` that sort before `key` (per-day counters: the days gone by)."""
    conn.execute("DELETE FROM host_state WHERE key >= ? AND key < ?", (prefix, key))
