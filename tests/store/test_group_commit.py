"""GroupCommit on a real database: the writes of one loop turn share one commit; a bad one fails alone."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from farmhost.store.db import Database
from farmhost.store.group_commit import Write


@pytest.fixture
def commits() -> list[str]:
    return []


@pytest.fixture
def db(tmp_path: Path, commits: list[str]) -> Iterator[Database]:
    database = Database.open(tmp_path)
    database.conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    database.conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    yield database
    database.close()


def _insert(key: str) -> Write:
    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (k) VALUES (?)", (key,))

    return write


def _keys(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as other:  # another connection: only what was committed
        return sorted(row[0] for row in other.execute("SELECT k FROM t"))


def test_writes_of_one_turn_share_one_commit_and_are_committed_when_awaited(db: Database, commits: list[str]) -> None:
    async def main() -> list[list[str]]:
        seen: list[list[str]] = []

        async def writer(key: str) -> None:
            await db.group_commit.write(_insert(key))
            seen.append(_keys(db.path))  # visible to another connection once the await returns

        await asyncio.gather(*(writer(f"k{i}") for i in range(8)))
        return seen

    seen = asyncio.run(main())
    assert commits == ["COMMIT"]
    assert all(keys == [f"k{i}" for i in range(8)] for keys in seen)


def test_a_bad_write_fails_alone_and_the_others_are_kept(db: Database) -> None:
    def bad(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (k) VALUES ('shared')")
        conn.execute("INSERT INTO nowhere VALUES (1)")

    committed: list[str] = []

    async def main() -> list[BaseException | None]:
        return await asyncio.gather(
            db.group_commit.write(_insert("a"), on_commit=lambda: committed.append("a")),
            db.group_commit.write(bad, on_commit=lambda: committed.append("bad")),
            db.group_commit.write(_insert("b"), on_commit=lambda: committed.append("b")),
            return_exceptions=True,
        )

    outcomes = asyncio.run(main())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], sqlite3.OperationalError) and "nowhere" in str(outcomes[1])
    assert _keys(db.path) == ["a", "b"]  # the bad write's first statement was rolled back with it
    assert committed == ["a", "b"]


def test_a_writer_cancelled_before_the_commit_writes_nothing(db: Database) -> None:
    async def main() -> None:
        kept = asyncio.create_task(db.group_commit.write(_insert("kept")))
        gone = asyncio.create_task(db.group_commit.write(_insert("gone")))
        await asyncio.sleep(0)  # both queued; the commit is due at the next turn
        gone.cancel()
        await kept
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(main())
    assert _keys(db.path) == ["kept"]


def test_a_writer_cancelled_after_the_commit_had_its_on_commit_run(db: Database) -> None:
    committed: list[str] = []

    async def main() -> None:
        task = asyncio.create_task(db.group_commit.write(_insert("x"), on_commit=lambda: committed.append("x")))
        await asyncio.sleep(0)  # queued
        await asyncio.sleep(0)  # committed; the task is due to resume
        assert committed == ["x"]
        task.cancel()  # too late to take the write back
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert _keys(db.path) == ["x"] and committed == ["x"]


def test_a_write_alone_commits_at_once_and_one_with_others_queued_joins_their_commit(
    db: Database, commits: list[str]
) -> None:
    async def main() -> tuple[list[str], bool, list[str]]:
        turned = False

        def turn() -> None:
            nonlocal turned
            turned = True

        asyncio.get_running_loop().call_soon(turn)
        await db.group_commit.write(_insert("lone"), alone=True)
        lone = _keys(db.path)  # committed before any other callback of the loop ran
        waited = turned
        commits.clear()
        queued = asyncio.ensure_future(db.group_commit.write(_insert("queued")))
        await asyncio.sleep(0)  # queued, not yet flushed
        await db.group_commit.write(_insert("alone but late"), alone=True)  # runs at once, up to its wait
        await queued
        return lone, waited, _keys(db.path)

    lone, waited, keys = asyncio.run(main())
    assert lone == ["lone"] and not waited, "alone: committed without waiting a loop turn"
    assert keys == ["alone but late", "lone", "queued"]
    assert commits == ["COMMIT"], "a write queued already is not left behind: the late one shares its commit"
