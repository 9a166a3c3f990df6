"""The SQLite store on real files: migrations, WAL, sharing the file with the CLI, one main group, ledger pruning."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from farmhost_testing import Daemon, drop, farmhost, wait_for, wait_result

from farmhost.files import temp_name, temp_target
from farmhost.ipc.results import prepared_for, result_name
from farmhost.store import groups, ledger
from farmhost.store.db import Database, iso
from farmhost.store.groups import Group
from farmhost.store.migrations import MIGRATIONS

NOW = datetime(2026, 5, 17, 6, 0, tzinfo=UTC)


def _schema(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_migrations_are_idempotent(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    assert db.schema_version() == len(MIGRATIONS)
    db.close()
    first = _schema(tmp_path / "farmhost.db")
    assert {"groups", "chats", "tasks", "task_runs", "outbox", "request_ledger"} <= {name for name, _ in first}
    for _ in range(2):
        again = Database.open(tmp_path)
        assert again.schema_version() == len(MIGRATIONS)
        again.close()
    assert _schema(tmp_path / "farmhost.db") == first


@pytest.mark.parametrize("round_", range(25))
def test_concurrent_first_opens_migrate_once(tmp_path: Path, round_: int) -> None:
    # The CLI and the daemon may create the database at the same moment. Switching to WAL takes an
    # exclusive lock that SQLite does not wait for, which failed about 1 round in 20 before the retry.
    barrier = threading.Barrier(4)

    def open_it() -> int:
        barrier.wait()
        db = Database.open(tmp_path)
        try:
            return db.schema_version()
        finally:
            db.close()

    with ThreadPoolExecutor(4) as pool:
        versions = [f.result() for f in [pool.submit(open_it) for _ in range(4)]]
    assert versions == [len(MIGRATIONS)] * 4
    assert [name for name, _ in _schema(tmp_path / "farmhost.db")].count("request_ledger") == 1


def test_wal_mode_is_on_and_persistent(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    try:
        with db.tx() as conn:
            ledger.record_done(
                conn, folder="main", request_id="r", queue="actions", kind="ping", action=None, result={}, at=NOW
            )
        assert (tmp_path / "farmhost.db-wal").exists()
        with closing(sqlite3.connect(tmp_path / "farmhost.db")) as other:  # a plain connection sees WAL too
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        db.close()


def _group(folder: str, jid: str, *, is_main: bool) -> Group:
    return Group(
        jid=jid, name=folder, folder=folder, trigger=None, requires_trigger=True, is_main=is_main, added_at=NOW
    )


def test_only_one_main_group_even_bypassing_the_registry(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    try:
        with db.tx() as conn:
            groups.insert_group(conn, _group("main", "telegram:1", is_main=True))
            groups.insert_group(conn, _group("field", "telegram:2", is_main=False))
            groups.insert_group(conn, _group("barn", "telegram:3", is_main=False))
        with pytest.raises(sqlite3.IntegrityError), db.tx() as conn:
            groups.insert_group(conn, _group("boss", "telegram:4", is_main=True))
        with pytest.raises(sqlite3.IntegrityError), db.tx() as conn:
            conn.execute("UPDATE groups SET is_main = 1 WHERE folder = 'field'")
        main = groups.main_group(db.conn)
        assert main is not None and main.folder == "main"
        assert [g.folder for g in groups.list_groups(db.conn)] == ["barn", "field", "main"]
    finally:
        db.close()


def test_ledger_prune_forgets_only_old_finished_requests(tmp_path: Path) -> None:
    db = Database.open(tmp_path)
    try:
        with db.tx() as conn:
            for rid, age, done in (("old-done", 40, True), ("new-done", 1, True), ("old-started", 40, False)):
                at = NOW - timedelta(days=age)
                if done:
                    ledger.record_done(
                        conn, folder="main", request_id=rid, queue="tasks", kind="x", action=None, result={}, at=at
                    )
                else:
                    ledger.mark_started(
                        conn, folder="main", request_id=rid, queue="actions", kind="x", action="y", at=at
                    )
        with db.tx() as conn:
            assert ledger.prune(conn, older_than=NOW - timedelta(days=30)) == 1
        assert ledger.get_entry(db.conn, "main", "old-done") is None
        assert ledger.get_entry(db.conn, "main", "new-done") is not None
        started = ledger.get_entry(db.conn, "main", "old-started")  # kept: its crash must still be answered
        assert started is not None and started.state == "started"
        assert ledger.count_by_state(db.conn) == {"done": 1, "started": 1}
    finally:
        db.close()


def _prepared(db: Database, tmp: str) -> bool:
    """What the results sweep asks of a temp file it finds (farmhost/ipc/service.py)."""
    return ledger.is_prepared_result(db.conn, "main", tmp, prepared_for(tmp))


def test_a_prepared_results_temp_name_tells_its_request_id() -> None:
    for request_id in ("r-1", "a.b", "x.json", ".hidden"):
        tmp = temp_name(result_name(request_id))
        assert temp_target(tmp) == result_name(request_id) and prepared_for(tmp) == request_id, tmp
        assert temp_name(result_name(request_id)) != tmp, "each temp name is fresh"
    for other in ("r-1.json", ".r-1.tmp", "..tmp", ".tmp", ".r-1.json.tmp.x", ".r-1.txt.0a1b2c3d.tmp"):
        assert prepared_for(other) is None, other


def test_a_file_answered_under_a_new_id_is_named_in_the_ids_own_ledger_row(tmp_path: Path) -> None:
    """A read's one transaction writes its ledger row only: the file it answered is named in that row.

    Another file of the same id (a re-sent request) gets a row of its own in `answered_files`; every question the
    host asks after a crash (`lookup`, `answering`, `is_prepared_result`) finds either, and forgets one alone.
    """
    first, second = ".r-1.json.0a1b2c3d.tmp", ".r-1.json.99999999.tmp"
    db = Database.open(tmp_path)
    try:
        with db.tx(durable=False) as conn:
            ledger.record_done(
                conn, folder="main", request_id="r-1", queue="actions", kind="ping", action=None, result={}, at=NOW
            )
            ledger.mark_answering(conn, folder="main", file_key="k1", request_id="r-1", result_tmp=first, at=NOW)
        assert db.conn.execute("SELECT count(*) FROM answered_files").fetchone()[0] == 0
        assert ledger.lookup(db.conn, "main", "r-1", "k1").answering == first
        assert ledger.answering(db.conn, "main", "k1", "r-1") == first
        assert _prepared(db, first)

        with db.tx(durable=False) as conn:  # the same id in another file: answered from the stored result
            ledger.mark_answering(conn, folder="main", file_key="k2", request_id="r-1", result_tmp=second, at=NOW)
        assert db.conn.execute("SELECT count(*) FROM answered_files").fetchone()[0] == 1
        assert ledger.lookup(db.conn, "main", "r-1", "k2").answering == second
        assert ledger.lookup(db.conn, "main", "r-1", "k1").answering == first
        assert ledger.answering(db.conn, "main", "k2", "r-1") == second
        assert _prepared(db, second)
        for other in (".r-1.json.deadbeef.tmp", ".r-2.json.0a1b2c3d.tmp", "r-1.json", ".r-1.tmp"):
            assert not _prepared(db, other), other
        assert ledger.lookup(db.conn, "field", "r-1", "k1").answering is None  # another group's id

        with db.tx(durable=False) as conn:  # the first could not be published: prepared again next time
            ledger.forget_answering(conn, "main", "k1", "r-1")
        assert ledger.lookup(db.conn, "main", "r-1", "k1").answering is None
        assert not _prepared(db, first)
        assert ledger.lookup(db.conn, "main", "r-1", "k2").answering == second
        with db.tx(durable=False) as conn:  # its retry is named in the id's row again
            ledger.mark_answering(conn, folder="main", file_key="k1", request_id="r-1", result_tmp=first, at=NOW)
        assert ledger.lookup(db.conn, "main", "r-1", "k1").answering == first
        assert db.conn.execute("SELECT count(*) FROM answered_files").fetchone()[0] == 1
    finally:
        db.close()


def test_cli_writes_while_the_daemon_holds_the_database(data_dir: Path) -> None:
    long_ago = iso(datetime.now(UTC) - timedelta(days=45))
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn, conn:
        conn.execute(
            "INSERT INTO request_ledger (folder, request_id, queue, kind, state, result, created_at)"
            " VALUES ('main', 'ancient', 'actions', 'ping', 'done', '{}', ?)",
            (long_ago,),
        )
    daemon = Daemon(data_dir).start()
    try:
        # The daemon prunes the ledger at start (default retention: 30 days).
        def ancient() -> int:
            with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
                return int(
                    conn.execute("SELECT count(*) FROM request_ledger WHERE request_id = 'ancient'").fetchone()[0]
                )

        wait_for(lambda: ancient() == 0, what="the old ledger entry to be pruned")
        drop(
            data_dir,
            "main",
            "tasks",
            {
                "type": "schedule_task",
                "requestId": "busy",
                "prompt": "p",
                "schedule_type": "interval",
                "schedule_value": 60000,
            },
        )
        assert wait_result(data_dir, "main", "busy")["status"] == "success"
        added = farmhost(
            "group", "add", "--jid", "telegram:400", "--name", "Orchard", "--folder", "orchard", data_dir=data_dir
        )
        assert added.returncode == 0, added.stderr
        listed = farmhost("task", "list", "--json", data_dir=data_dir)
        assert listed.returncode == 0 and '"groupFolder": "main"' in listed.stdout
        # The daemon notices the CLI's commit and serves the new group without a restart.
        drop(data_dir, "orchard", "actions", {"type": "ping", "requestId": "orchard-ping"})
        assert wait_result(data_dir, "orchard", "orchard-ping")["status"] == "success"
        second = farmhost(
            "group", "add", "--jid", "telegram:401", "--name", "Boss", "--folder", "boss", "--main", data_dir=data_dir
        )
        assert second.returncode == 2 and "a main group already exists" in second.stderr
    finally:
        assert daemon.stop() == 0
