"""The group registry table: which chat is bound to which workspace folder, and which one is main."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from farmhost.store.db import iso, parse_iso


@dataclass(frozen=True, kw_only=True)
class Group:
    """A registered chat and its workspace folder."""

    jid: str
    name: str
    folder: str
    trigger: str | None
    requires_trigger: bool
    is_main: bool
    added_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """The contract's field names."""
        return {
            "jid": self.jid,
            "name": self.name,
            "folder": self.folder,
            "trigger": self.trigger,
            "requiresTrigger": self.requires_trigger,
            "isMain": self.is_main,
            "addedAt": iso(self.added_at),
        }


def _group(row: sqlite3.Row) -> Group:
    added = parse_iso(row["added_at"])
    assert added is not None
    return Group(
        jid=row["jid"],
        name=row["name"],
        folder=row["folder"],
        trigger=row["trigger"],
        requires_trigger=bool(row["requires_trigger"]),
        is_main=bool(row["is_main"]),
        added_at=added,
    )


def list_groups(conn: sqlite3.Connection) -> list[Group]:
    """All registered groups, ordered by folder."""
    return [_group(row) for row in conn.execute("SELECT * FROM groups ORDER BY folder")]


def get_group(conn: sqlite3.Connection, folder: str) -> Group | None:
    """The group of `folder` (exact, case-sensitive), if registered."""
    row = conn.execute("SELECT * FROM groups WHERE folder = ?", (folder,)).fetchone()
    return _group(row) if row else None


def find_by_jid(conn: sqlite3.Connection, jid: str) -> Group | None:
    """The group bound to chat `jid`, if any."""
    row = conn.execute("SELECT * FROM groups WHERE jid = ?", (jid,)).fetchone()
    return _group(row) if row else None


def find_folder_casefold(conn: sqlite3.Connection, folder: str) -> Group | None:
    """A group whose folder equals `folder` ignoring case (folders must differ by more than case)."""
    row = conn.execute("SELECT * FROM groups WHERE lower(folder) = lower(?)", (folder,)).fetchone()
    return _group(row) if row else None


def main_group(conn: sqlite3.Connection) -> Group | None:
    """The main group, if one is registered."""
    row = conn.execute("SELECT * FROM groups WHERE is_main = 1").fetchone()
    return _group(row) if row else None


def insert_group(conn: sqlite3.Connection, group: Group) -> None:
    """Register a group (the caller validated it)."""
    conn.execute(
        "INSERT INTO groups (folder, jid, name, trigger, requires_trigger, is_main, added_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            group.folder,
            group.jid,
            group.name,
            group.trigger,
            int(group.requires_trigger),
            int(group.is_main),
            iso(group.added_at),
        ),
    )


def delete_group(conn: sqlite3.Connection, folder: str) -> bool:
    """Unregister a group; its files are kept. Returns whether it existed."""
    return conn.execute("DELETE FROM groups WHERE folder = ?", (folder,)).rowcount > 0


def count_groups(conn: sqlite3.Connection) -> int:
    """How many groups are registered."""
    return int(conn.execute("SELECT count(*) FROM groups").fetchone()[0])


def folders(conn: sqlite3.Connection) -> list[str]:
    """The registered groups' folders, sorted."""
    return [str(row[0]) for row in conn.execute("SELECT folder FROM groups ORDER BY folder")]
