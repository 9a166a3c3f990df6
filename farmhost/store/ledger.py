"""The request ledger: each (group, requestId) is executed at most once and its result kept."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from farmhost.store.db import iso

LedgerState = Literal["started", "done"]


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """What the host remembers of one request."""

    folder: str
    request_id: str
    queue: str
    kind: str
    action: str | None
    state: LedgerState
    result: dict[str, Any] | None


def get_entry(conn: sqlite3.Connection, folder: str, request_id: str) -> LedgerEntry | None:
    """The ledger entry of a request, if the host has seen it."""
    row = conn.execute(
        "SELECT * FROM request_ledger WHERE folder = ? AND request_id = ?", (folder, request_id)
    ).fetchone()
    return None if row is None else _entry(row)


def count_of(conn: sqlite3.Connection, folder: str) -> int:
    """How many requests of `folder` the ledger still holds (a second file with one of their ids gets its result)."""
    return int(conn.execute("SELECT count(*) FROM request_ledger WHERE folder = ?", (folder,)).fetchone()[0])


def _entry(row: sqlite3.Row) -> LedgerEntry:
    return LedgerEntry(
        folder=row["folder"],
        request_id=row["request_id"],
        queue=row["queue"],
        kind=row["kind"],
        action=row["action"],
        state=row["state"],
        result=json.loads(row["result"]) if row["result"] else None,
    )


@dataclass(frozen=True, kw_only=True)
class Lookup:
    """What the ledger knows before a request file is handled: its id's entry and this file's prepared result."""

    entry: LedgerEntry | None
    answering: str | None  # the temp name of this very file's prepared result (see `answering`)


def lookup(conn: sqlite3.Connection, folder: str, request_id: str, file_key: str) -> Lookup:
    """`get_entry` and `answering` in one statement: the one read of a request answered from a file."""
    row = conn.execute(
        "SELECT l.*, COALESCE(CASE WHEN l.file_key = ? THEN l.result_tmp END,"
        " (SELECT result_tmp FROM answered_files WHERE folder = ? AND file_key = ?)) AS answering_tmp"
        " FROM (SELECT 1) LEFT JOIN request_ledger AS l ON l.folder = ? AND l.request_id = ?",
        (file_key, folder, file_key, folder, request_id),
    ).fetchone()
    tmp = row["answering_tmp"]
    return Lookup(entry=None if row["folder"] is None else _entry(row), answering=None if tmp is None else str(tmp))


def mark_started(
    conn: sqlite3.Connection, *, folder: str, request_id: str, queue: str, kind: str, action: str | None, at: datetime
) -> None:
    """Record that a request with outside effects is about to run (so a crash turns it into `interrupted`)."""
    conn.execute(
        "INSERT INTO request_ledger (folder, request_id, queue, kind, action, state, created_at)"
        " VALUES (?, ?, ?, ?, ?, 'started', ?)",
        (folder, request_id, queue, kind, action, iso(at)),
    )


def record_done(
    conn: sqlite3.Connection,
    *,
    folder: str,
    request_id: str,
    queue: str,
    kind: str,
    action: str | None,
    result: dict[str, Any],
    at: datetime,
    result_json: str | None = None,
) -> None:
    """Store the final result of a request (inserting or finishing a started entry).

    `result_json`: `result` already serialised (the text of its result file), so it is not serialised twice.
    """
    conn.execute(
        "INSERT INTO request_ledger (folder, request_id, queue, kind, action, state, result, created_at, finished_at)"
        " VALUES (?, ?, ?, ?, ?, 'done', ?, ?, ?)"
        " ON CONFLICT(folder, request_id) DO UPDATE SET state = 'done', result = excluded.result,"
        " finished_at = excluded.finished_at",
        (folder, request_id, queue, kind, action, result_json or json.dumps(result), iso(at), iso(at)),
    )


def mark_answering(
    conn: sqlite3.Connection, *, folder: str, file_key: str, request_id: str, result_tmp: str, at: datetime
) -> None:
    """Record that the result of one claimed request file is prepared under `result_tmp`, about to be published.

    Renaming the temp file publishes it atomically, so after a crash the temp file's existence tells whether it
    was published: see `answering`.

    The first file answered under a request id is named in the id's own ledger row (written in the same
    transaction for a read: no other row, no other index); another file of the same id (a re-sent request) gets
    a row of `answered_files`.
    """
    named = conn.execute(
        "UPDATE request_ledger SET file_key = ?, result_tmp = ?"
        " WHERE folder = ? AND request_id = ? AND (file_key IS NULL OR file_key = ?)",
        (file_key, result_tmp, folder, request_id, file_key),
    ).rowcount
    if not named:
        conn.execute(
            "INSERT OR REPLACE INTO answered_files (folder, file_key, request_id, result_tmp, answered_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (folder, file_key, request_id, result_tmp, iso(at)),
        )


def answering(conn: sqlite3.Connection, folder: str, file_key: str, request_id: str) -> str | None:
    """The prepared result's temp name of this very file (not merely its requestId), if it got that far.

    A second file reusing a requestId has another key and gets the stored result; only the same file, left in
    the spool by a kill -9, finds its row here.
    """
    row = conn.execute(
        "SELECT COALESCE((SELECT result_tmp FROM request_ledger WHERE folder = ? AND request_id = ? AND file_key = ?),"
        " (SELECT result_tmp FROM answered_files WHERE folder = ? AND file_key = ?))",
        (folder, request_id, file_key, folder, file_key),
    ).fetchone()
    return None if row[0] is None else str(row[0])


def forget_answering(conn: sqlite3.Connection, folder: str, file_key: str, request_id: str) -> None:
    """The prepared result could not be published: the next attempt prepares it again."""
    conn.execute(
        "UPDATE request_ledger SET file_key = NULL, result_tmp = NULL"
        " WHERE folder = ? AND request_id = ? AND file_key = ?",
        (folder, request_id, file_key),
    )
    conn.execute("DELETE FROM answered_files WHERE folder = ? AND file_key = ?", (folder, file_key))


def is_prepared_result(conn: sqlite3.Connection, folder: str, result_tmp: str, request_id: str | None) -> bool:
    """Whether a temp file in a results directory is a prepared result a restart may still publish.

    `request_id`: the one its name is for (`results.prepared_for`), so the lookup takes the ledger's key.
    """
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM request_ledger WHERE folder = ? AND request_id = ? AND result_tmp = ?)"
        " OR EXISTS (SELECT 1 FROM answered_files WHERE folder = ? AND result_tmp = ?)",
        (folder, request_id, result_tmp, folder, result_tmp),
    ).fetchone()
    return bool(row[0])


def prune(conn: sqlite3.Connection, *, older_than: datetime) -> int:
    """Forget finished requests (and answered files) created before `older_than`; returns how many."""
    cutoff = iso(older_than)
    conn.execute("DELETE FROM answered_files WHERE answered_at < ?", (cutoff,))
    return conn.execute("DELETE FROM request_ledger WHERE state = 'done' AND created_at < ?", (cutoff,)).rowcount


def count_by_state(conn: sqlite3.Connection) -> dict[str, int]:
    """Ledger size per state (for doctor)."""
    return {row[0]: row[1] for row in conn.execute("SELECT state, count(*) FROM request_ledger GROUP BY state")}
