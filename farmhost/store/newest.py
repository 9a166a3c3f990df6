"""The newest "written at" time the database records, over every table whose rows note when they were written.

`farmhost doctor` compares it with the clock: a row from the future means the clock was wrong then or is now.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Final

# Columns that record "now" when a row is written: none of them may be in the future.
PAST_COLUMNS: Final = (
    ("groups", "added_at"),
    ("tasks", "created_at"),
    ("task_runs", "claimed_at"),
    ("outbox", "created_at"),
    ("request_ledger", "created_at"),
    ("transcript", "sent_at"),
    ("telegram_updates", "received_at"),
)


def newest_written(conn: sqlite3.Connection) -> datetime | None:
    """The latest aware time in PAST_COLUMNS; a table that is missing or holds no readable time is passed over."""
    newest: datetime | None = None
    for table, column in PAST_COLUMNS:
        try:
            row = conn.execute(f"SELECT max({column}) FROM {table}").fetchone()  # fixed names, no input
            value = datetime.fromisoformat(row[0]) if row and row[0] else None
        except (sqlite3.Error, ValueError):
            continue
        if value is not None and value.tzinfo is not None and (newest is None or value > newest):
            newest = value
    return newest
