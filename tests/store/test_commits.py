"""CommitWatcher on a real database and real inotify: other connections' commits are told, the daemon's own are not."""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import subprocess
import sys
import termios
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import scaled, wait_for_async

from farmhost.store import host_state
from farmhost.store.commits import CommitWatcher
from farmhost.store.db import Database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.open(tmp_path)
    yield database
    database.close()


# With inotify, no safety tick within a test: whatever is told was seen through the log's events.
NEVER = 3600.0


@asynccontextmanager
async def watching(db: Database, *, inotify: bool) -> AsyncIterator[tuple[CommitWatcher, list[str]]]:
    """A started watcher with two listeners that record their calls in one list ('a', 'b')."""
    watcher = CommitWatcher(db, inotify=inotify, safety_seconds=NEVER)
    heard: list[str] = []
    watcher.subscribe(lambda: heard.append("a"))
    watcher.subscribe(lambda: heard.append("b"))
    watcher.start()
    try:
        yield watcher, heard
    finally:
        await watcher.stop()


def commit_elsewhere(path: Path, key: str) -> None:
    """One commit by another process that then exits, as `farmhost group add` does."""
    code = (
        "import sys; from pathlib import Path; from farmhost.store import host_state; "
        "from farmhost.store.db import Database\n"
        "db = Database(Path(sys.argv[1]))\n"
        "with db.tx() as conn: host_state.put(conn, sys.argv[2], 'x')\n"
        "db.close()\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path), key], check=True, timeout=scaled(30))


async def until(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    return await wait_for_async(condition, timeout=timeout, interval=0.01, what=what)


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "poll"])
async def test_a_commit_by_another_process_is_told_once_to_every_listener(db: Database, inotify: bool) -> None:
    async with watching(db, inotify=inotify) as (watcher, heard):
        assert watcher.watching is inotify
        await asyncio.to_thread(commit_elsewhere, db.path, "first")
        await until(lambda: len(heard) == 2, "both listeners told of the commit")
        assert heard == ["a", "b"]
        await asyncio.to_thread(commit_elsewhere, db.path, "second")
        await until(lambda: len(heard) == 4, "both listeners told of the second commit")
    assert heard == ["a", "b", "a", "b"]


async def test_the_daemons_own_commits_are_not_told(db: Database) -> None:
    async with watching(db, inotify=True) as (_, heard):
        for n in range(5):
            with db.tx() as conn:
                host_state.put(conn, f"own-{n}", "x")
        # Another process commits after them: when it is told, the own commits were looked at (events are in order).
        await asyncio.to_thread(commit_elsewhere, db.path, "theirs")
        await until(lambda: heard, "the other process's commit told")
        assert heard == ["a", "b"]


def pending_events(watcher: CommitWatcher) -> int:
    """Bytes of inotify events on the log not read yet (what would wake the daemon's loop)."""
    assert watcher._inotify is not None
    available = array.array("i", [0])
    fcntl.ioctl(watcher._inotify.fileno(), termios.FIONREAD, available)
    return available[0]


async def test_the_daemons_own_commits_ask_sqlite_nothing(db: Database) -> None:
    """The log's events of the daemon's own commit are read without a check: the commit told its version."""
    async with watching(db, inotify=True) as (watcher, heard):
        checks = watcher.checks
        for n in range(5):
            with db.tx(durable=n % 2 == 0) as conn:
                host_state.put(conn, f"own-{n}", "x")
            assert pending_events(watcher) > 0
            for _ in range(100):  # turns of the loop until it read them (one, unless the machine is very busy)
                await asyncio.sleep(0)
                if pending_events(watcher) == 0:
                    break
            assert pending_events(watcher) == 0
            # Read without asking (each commit's read re-arms the settle timer's one look, SETTLE_SECONDS later).
            assert watcher.checks == checks
        assert heard == []


async def test_a_commit_before_the_daemons_own_is_told_through_the_own_commit(db: Database) -> None:
    """Another process commits, then the daemon does before its loop read the log: the own commit tells it."""
    async with watching(db, inotify=True) as (watcher, heard):
        commit_elsewhere(db.path, "theirs")  # blocks the loop: their events wait unread
        with db.tx() as conn:
            host_state.put(conn, "own", "x")
        checks = watcher.checks
        await asyncio.sleep(0)  # one loop turn: told from the version inside the own commit, without asking SQLite
        assert heard == ["a", "b"]
        assert watcher.checks == checks


async def test_an_own_commit_from_a_worker_thread_tells_the_listeners_on_the_loop(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's connection may commit in a thread: what it learned is told on the loop, nothing raised."""
    async with watching(db, inotify=True) as (_, heard):
        commit_elsewhere(db.path, "theirs")  # blocks the loop: their events wait unread

        def own() -> None:
            with db.tx() as conn:
                host_state.put(conn, "own-in-a-thread", "x")

        worker = threading.Thread(target=own)
        worker.start()
        worker.join()  # still without a loop turn: the own commit is the first to learn of theirs
        await until(lambda: heard, "the other process's commit told")
        assert heard == ["a", "b"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_writer_that_keeps_its_connection_open_is_told_too(db: Database) -> None:
    """A commit whose frames reach the log before it is published: the watcher asks again once it settled."""
    async with watching(db, inotify=True) as (_, heard):
        with closing(Database(db.path)) as other:  # stays open: no close of the log follows its commit

            def commit(n: int) -> None:
                with other.tx() as conn:  # in a thread: its fsync may still run when the loop reads the event
                    host_state.put(conn, f"open-{n}", "x")

            for n in range(5):
                told = len(heard)
                await asyncio.to_thread(commit, n)
                await until(lambda told=told: len(heard) > told, f"commit {n} of an open connection told")


async def test_a_failing_listener_does_not_keep_the_others_from_being_told(db: Database) -> None:
    watcher = CommitWatcher(db, safety_seconds=NEVER)
    heard: list[str] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    watcher.subscribe(broken)
    watcher.subscribe(lambda: heard.append("after"))
    watcher.start()
    try:
        await asyncio.to_thread(commit_elsewhere, db.path, "x")
        await until(lambda: heard, "the second listener told")
    finally:
        await watcher.stop()
