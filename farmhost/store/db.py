"""The SQLite connection: WAL, migrations, the transaction helper every repository uses, a query-only reader."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from farmhost.errors import ConfigError
from farmhost.store.group_commit import GroupCommit
from farmhost.store.migrations import MIGRATIONS

logger = logging.getLogger(__name__)

DB_FILE: Final = "farmhost.db"
# The CLI and the daemon share the file; a writer holds the lock for milliseconds, so 10 s only
# ever expires when something is badly wrong.
BUSY_TIMEOUT_MS: Final = 10_000


class SchemaTooNew(ConfigError):
    """The database was migrated by a newer farmhost than this one: it is refused, never used or changed."""

    def __init__(self, path: Path, found: int) -> None:
        super().__init__(
            f"{path} has schema version {found}, but this farmhost only knows versions up to {len(MIGRATIONS)}: "
            "a newer farmhost wrote it and farmhost never migrates a database backwards. Run the newer farmhost "
            "again, or restore the backup taken before the upgrade (docs/operations.md)"
        )
        self.found = found
        self.known = len(MIGRATIONS)


class Database:
    """One connection to `farmhost.db`, used from one thread (the daemon's event loop or a CLI command)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._enable_wal()
        self.conn.execute("PRAGMA foreign_keys = ON")
        self._durable = True
        self.conn.execute("PRAGMA synchronous = FULL")
        self.group_commit = GroupCommit(self)  # non-durable writes of one loop turn, one transaction
        self._after_commit: Callable[[int], None] | None = None
        try:
            self._migrate()
        except BaseException:
            self.conn.close()
            raise

    def _enable_wal(self) -> None:
        """Switch to WAL, waiting out another process that is creating the same database.

        Changing the journal mode needs an exclusive lock and SQLite does not call the busy
        handler for it, so two first opens at once (the CLI and the daemon) would fail one of them.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay = 0.005
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    @classmethod
    def open(cls, data_dir: Path) -> Database:
        """Open (creating and migrating) the database of a data directory."""
        return cls(data_dir / DB_FILE)

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    @contextmanager
    def tx(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """Run a write transaction (BEGIN IMMEDIATE).

        Args:
            durable: fsync the WAL at commit (state changes); False for records that may be
                recomputed after a power cut (results of read-only requests). Both survive kill -9.
        """
        if durable != self._durable:
            self.conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
            self._durable = durable
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            # Inside the transaction, which holds the write lock since BEGIN IMMEDIATE: every other connection's
            # commit is already in it, and asking costs no system call (outside, it takes SQLite's read locks).
            version = self.data_version() if self._after_commit is not None else 0
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        if self._after_commit is not None:
            try:
                self._after_commit(version)
            except Exception:
                logger.exception("after-commit hook %r failed", self._after_commit)

    def after_commit(self, hook: Callable[[int], None] | None) -> None:
        """Call `hook(data_version)` after each commit of this connection's own (None: stop); one hook at most.

        The version is the one inside the committed transaction: it differs from an earlier `data_version()`
        exactly when another connection committed in between (this connection's own commits never change it).
        """
        self._after_commit = hook

    def data_version(self) -> int:
        """A number that changes whenever another connection (the CLI) commits."""
        row = self.conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def schema_version(self) -> int:
        """The applied migration count."""
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        """Apply the migrations this database lacks; refuse one that a newer farmhost migrated further.

        Raises:
            SchemaTooNew: `user_version` is beyond the last migration this code knows (a downgrade).
        """
        if self.schema_version() > len(MIGRATIONS):
            raise SchemaTooNew(self.path, self.schema_version())
        if self.schema_version() == len(MIGRATIONS):
            return
        with self.tx():
            current = self.schema_version()  # re-read under the write lock: another process may have migrated
            for number, script in enumerate(MIGRATIONS[current:], start=current + 1):
                for statement in _statements(script):
                    self.conn.execute(statement)
                self.conn.execute(f"PRAGMA user_version = {number}")


def _statements(script: str) -> list[str]:
    """Split a migration into statements; a trigger's body holds ';' too, so split where SQLite says one ends."""
    statements, pending = [], ""
    for part in script.split(";"):
        pending += part + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending.strip())
            pending = ""
    return statements


def connect_query_only(path: Path) -> sqlite3.Connection:
    """A connection of its own to the database at `path` that cannot write (`PRAGMA query_only`), for a reader thread."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def now_utc() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


def iso(moment: datetime | None) -> str | None:
    """Store a datetime as ISO-8601 UTC text (sortable)."""
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="milliseconds")


def parse_iso(text: str | None) -> datetime | None:
    """Read a datetime stored by `iso`."""
    return None if text is None else datetime.fromisoformat(text)
