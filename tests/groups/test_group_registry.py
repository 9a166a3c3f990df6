"""The group registry: one copy in memory, its announcements, and a CLI change reaching every consumer of a daemon."""

from __future__ import annotations

import json
import secrets
import sqlite3
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    FIELD_JID,
    MAIN_JID,
    Daemon,
    clean_env,
    drop,
    farmhost,
    init_data_dir_in_process,
    register_in_process,
    wait_for,
    wait_result,
)

from farmhost.groups.live import GroupChange, GroupRegistry
from farmhost.store import task_runs, tasks
from farmhost.store.db import Database, now_utc
from farmhost.store.tasks import Task

LATE_JID = "telegram:300"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


# the registry in-process ----------------------------------------------------------------------------------------


def test_a_reload_tells_every_subscriber_what_was_added_removed_and_changed(root: Path) -> None:
    db = Database.open(root)
    try:
        registry = GroupRegistry(db)
        assert [g.folder for g in registry.groups] == ["field", "main"]
        main = registry.main()
        assert main is not None and main.jid == MAIN_JID
        heard: list[tuple[str, GroupChange]] = []

        def broken(change: GroupChange) -> None:
            raise RuntimeError("a subscriber's bug")

        registry.subscribe(broken)
        registry.subscribe(lambda change: heard.append(("ipc", change)))
        registry.subscribe(lambda change: heard.append(("other", change)))

        # Another connection: one group added, one removed, one renamed.
        register_in_process(root, jid="telegram:500", name="Barn crew", folder="barn")
        with closing(sqlite3.connect(root / "farmhost.db")) as other, other:
            other.execute("DELETE FROM groups WHERE folder = 'field'")
            other.execute("UPDATE groups SET name = 'Head office' WHERE folder = 'main'")
        assert [g.folder for g in registry.groups] == ["field", "main"]  # nothing read until told to
        registry.reload()

        (_, change), (_, same) = heard
        assert [name for name, _ in heard] == ["ipc", "other"] and same is change
        assert [g.folder for g in change.added] == ["barn"]
        assert [(g.folder, g.jid) for g in change.removed] == [("field", FIELD_JID)]
        assert [(g.folder, g.name) for g in change.changed] == [("main", "Head office")]
        assert [g.folder for g in registry.groups] == ["barn", "main"]
        assert registry.get("field") is None and registry.get("barn") == change.added[0]
        assert registry.main() == change.changed[0]

        registry.reload()  # nothing changed since: nobody is told
        assert len(heard) == 2
    finally:
        db.close()


# a CLI change to a running daemon ------------------------------------------------------------------------------


def _task(folder: str) -> Task:
    """An every-second task of `folder`, first due a second from now, as another process would commit it."""
    now = now_utc().replace(microsecond=now_utc().microsecond // 1000 * 1000)
    return Task(
        id=f"late-{secrets.token_hex(3)}",
        group_folder=folder,
        prompt="check the late field",
        schedule_type="interval",
        schedule_value="1000",
        context_mode="isolated",
        status="active",
        next_run=now + timedelta(seconds=1),
        last_run=None,
        anchor=now,
        created_at=now,
        created_by="test",
    )


def _runs(data_dir: Path, task_id: str) -> list[task_runs.RunRecord]:
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        return task_runs.list_runs(conn, task_id, limit=1000)


def _snapshot(data_dir: Path, folder: str, name: str) -> Any:
    try:
        return json.loads((data_dir / "ipc" / folder / name).read_text())
    except (OSError, ValueError):
        return None  # not written yet, or being replaced


def _main_lists(data_dir: Path) -> list[str]:
    document = _snapshot(data_dir, "main", "available_groups.json") or {"groups": []}
    return [entry["folder"] for entry in document["groups"] if entry["isRegistered"]]


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_a_group_the_cli_adds_and_removes_reaches_every_consumer_of_the_daemon(root: Path, mode: str) -> None:
    daemon = Daemon(root, env=clean_env(FARMHOST_IPC_MODE=mode)).start()
    try:
        added = farmhost("group", "add", "--jid", LATE_JID, "--name", "Late", "--folder", "late", data_dir=root)
        assert added.returncode == 0, added.stderr
        # The IPC service serves it (announced by the registry, which the one commit watcher told to re-read).
        rid = f"ping-{secrets.token_hex(4)}"
        drop(root, "late", "actions", {"type": "ping", "requestId": rid})
        assert wait_result(root, "late", rid)["status"] == "success", daemon.log()
        # The snapshots: main's list of groups has it.
        wait_for(lambda: "late" in _main_lists(root), what="late in main's available_groups.json")

        # A task of the new group committed by another process: the same watcher tells the scheduler, which fires
        # it, and the agent runtime finds the group in the registry (no LLM here, so the run ends in an error,
        # but not "not registered").
        task = _task("late")
        db = Database.open(root)
        try:
            with db.tx() as conn:
                tasks.insert_task(conn, task)
        finally:
            db.close()
        (first, *_) = wait_for(
            lambda: [r for r in _runs(root, task.id) if r.finished_at is not None], what="the late task's first run"
        )
        assert first.status in ("ok", "error") and "not registered" not in (first.detail or ""), first
        wait_for(
            lambda: task.id in [t["id"] for t in _snapshot(root, "late", "current_tasks.json") or []],
            what="the task in late's current_tasks.json",
        )

        removed = farmhost("group", "remove", "late", data_dir=root)
        assert removed.returncode == 0, removed.stderr
        # Detached: its heartbeat says stopped; main's list drops it; the scheduler's next claim skips the task.
        wait_for(
            lambda: (_snapshot(root, "late", "host_status.json") or {}).get("status") == "stopped",
            what="late's host_status.json stopped",
        )
        wait_for(lambda: "late" not in _main_lists(root), what="late gone from main's available_groups.json")
        wait_for(
            lambda: [r for r in _runs(root, task.id) if "is not registered any more" in (r.detail or "")],
            what="the late task's next due time skipped",
        )
        assert "stopped serving group late" in daemon.log()
        assert daemon.log().count("serving group late (") == 1  # attached once, not once per service
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()
