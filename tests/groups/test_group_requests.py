"""Group handlers through the real daemon: register_group, refresh_groups and the available_groups.json snapshot."""

from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    FIELD_JID,
    MAIN_JID,
    drop,
    farmhost,
    init_data_dir,
    quarantined,
    running_daemon,
    wait_for,
    wait_result,
)

from farmhost.store.chats import upsert_chat
from farmhost.store.db import Database

_ids = itertools.count()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon for the module; each test registers its own folders and chats."""
    root = init_data_dir(tmp_path_factory.mktemp("groups") / "data")
    with running_daemon(root):
        yield root


def ask(data_dir: Path, folder: str, queue: str, payload: dict[str, Any]) -> dict[str, Any]:
    rid = f"grp-{next(_ids)}"
    drop(data_dir, folder, queue, {**payload, "requestId": rid})
    return wait_result(data_dir, folder, rid)


def register(data_dir: Path, source: str, **fields: Any) -> dict[str, Any]:
    return ask(data_dir, source, "tasks", {"type": "register_group", **fields})


def _db_rows(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def available(data_dir: Path, folder: str) -> dict[str, Any]:
    return json.loads((data_dir / "ipc" / folder / "available_groups.json").read_text())  # type: ignore[no-any-return]


def test_register_group_from_main_creates_dirs_and_is_served_at_once(farm: Path) -> None:
    result = register(farm, "main", jid="telegram:300", name="Barn team", folder="barn")
    assert (result["status"], result["errorCode"]) == ("success", None), result
    group = result["result"]
    assert {k: v for k, v in group.items() if k != "addedAt"} == {
        "jid": "telegram:300",
        "name": "Barn team",
        "folder": "barn",
        "trigger": "@Barn",
        "requiresTrigger": True,
        "isMain": False,
    }
    assert (farm / "groups" / "barn").is_dir()
    for sub in ("messages", "tasks", "actions", "action_results"):
        assert (farm / "ipc" / "barn" / sub).is_dir(), sub
    # Served without a restart: snapshots are there and a ping is answered.
    assert available(farm, "barn")["groups"] == []
    assert json.loads((farm / "ipc" / "barn" / "current_tasks.json").read_text()) == []
    drop(farm, "barn", "actions", {"type": "ping", "requestId": "barn-ping"})
    assert wait_result(farm, "barn", "barn-ping")["result"]["pong"] is True
    status = json.loads((farm / "ipc" / "barn" / "host_status.json").read_text())
    assert status["status"] == "alive"
    listed = {g["folder"]: g for g in json.loads(farmhost("group", "list", "--json", data_dir=farm).stdout)}
    assert listed["barn"]["isMain"] is False and listed["main"]["isMain"] is True
    # main's snapshot lists the new group as registered.
    rows = {g["jid"]: g for g in available(farm, "main")["groups"]}
    assert rows["telegram:300"] == {
        "jid": "telegram:300",
        "name": "Barn team",
        "folder": "barn",
        "isRegistered": True,
        "lastActivity": None,
    }
    assert {MAIN_JID, FIELD_JID} <= rows.keys()


def test_register_group_with_trigger_settings(farm: Path) -> None:
    result = register(
        farm, "main", jid="telegram:301", name="Dairy", folder="dairy", trigger="@cow", requiresTrigger=False
    )
    assert result["result"]["trigger"] == "@cow" and result["result"]["requiresTrigger"] is False


@pytest.mark.parametrize(
    ("source", "fields", "code", "sentence"),
    [
        ("field", {"jid": "telegram:310", "name": "Sneaky", "folder": "sneaky"}, "unauthorized", "only allowed from"),
        ("main", {"jid": "telegram:311", "name": "E", "folder": "errors"}, "invalid_request", "reserved"),
        ("main", {"jid": "telegram:312", "name": "G", "folder": "Global"}, "invalid_request", "reserved"),
        ("main", {"jid": "telegram:313", "name": "T", "folder": "../etc"}, "invalid_request", "not valid"),
        ("main", {"jid": "telegram:314", "name": "T", "folder": "-dash"}, "invalid_request", "not valid"),
        ("main", {"jid": "telegram:315", "name": "T", "folder": "a" * 65}, "invalid_request", "folder"),
        ("main", {"jid": "telegram:316", "name": "F", "folder": "FIELD"}, "conflict", "already used"),
        ("main", {"jid": FIELD_JID, "name": "F", "folder": "field2"}, "conflict", "already registered"),
        ("main", {"jid": "telegram:317", "name": "M", "folder": "boss", "isMain": True}, "invalid_request", "isMain"),
        ("main", {"jid": "not-a-jid", "name": "M", "folder": "nojid"}, "invalid_request", "jid"),
        # field's chat written another way: a second group bound to it could post into field's chat
        ("main", {"jid": "telegram:0200", "name": "Ghost", "folder": "ghost"}, "invalid_request", "telegram:200"),
        ("main", {"jid": "telegram:-00200", "name": "Ghost", "folder": "ghost"}, "invalid_request", "telegram:-200"),
    ],
)
def test_register_group_refusals(farm: Path, source: str, fields: dict[str, Any], code: str, sentence: str) -> None:
    before = sorted(p.name for p in (farm / "ipc").iterdir())
    result = register(farm, source, **fields)
    assert (result["status"], result["errorCode"]) == ("error", code), result
    assert sentence in result["error"]
    assert sorted(p.name for p in (farm / "ipc").iterdir()) == before
    folders = [row[0] for row in _db_rows(farm, "SELECT folder FROM groups")]
    assert fields["folder"] not in folders and "field" in folders


def test_is_main_in_register_group_is_quarantined_with_its_reason(farm: Path) -> None:
    result = register(farm, "main", jid="telegram:320", name="Boss", folder="boss2", isMain=False)
    assert result["errorCode"] == "invalid_request"
    # the host answers first, then moves the file to quarantine: the note can lag the result by a moment
    note = wait_for(
        lambda: next((n for n in quarantined(farm, "main") if n["file"] == f"{result['requestId']}.json"), None),
        what="the quarantine note",
    )
    assert note["errorCode"] == "invalid_request" and "isMain" in note["reason"]


def _seen_chat(data_dir: Path, jid: str, name: str) -> None:
    """A chat the bot has seen but nobody registered (what the Telegram side records)."""
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            upsert_chat(conn, jid=jid, name=name, channel="telegram", seen_at=datetime(2026, 5, 17, 6, tzinfo=UTC))
    finally:
        db.close()


def test_refresh_groups_is_main_only_and_lists_unregistered_chats(farm: Path) -> None:
    _seen_chat(farm, "telegram:-1009", "Neighbours")
    refused = ask(farm, "field", "tasks", {"type": "refresh_groups"})
    assert refused["errorCode"] == "unauthorized"
    result = ask(farm, "main", "tasks", {"type": "refresh_groups"})
    assert result["status"] == "success"
    rows = {g["jid"]: g for g in available(farm, "main")["groups"]}
    assert rows["telegram:-1009"] == {
        "jid": "telegram:-1009",
        "name": "Neighbours",
        "folder": None,
        "isRegistered": False,
        "lastActivity": "2026-05-17T06:00:00.000+00:00",
    }
    assert rows[MAIN_JID]["isRegistered"] is True and rows[FIELD_JID]["isRegistered"] is True
    assert available(farm, "field")["groups"] == []  # non-main groups never see the chat list
    # Registering the seen chat turns it into a registered group in main's snapshot.
    assert register(farm, "main", jid="telegram:-1009", name="Neighbours", folder="neighbours")["status"] == "success"
    rows = {g["jid"]: g for g in available(farm, "main")["groups"]}
    assert (rows["telegram:-1009"]["isRegistered"], rows["telegram:-1009"]["folder"]) == (True, "neighbours")


def test_a_group_removed_with_the_cli_stops_being_served(farm: Path) -> None:
    assert register(farm, "main", jid="telegram:330", name="Temp", folder="temp")["status"] == "success"
    done = farmhost("group", "remove", "temp", data_dir=farm)
    assert done.returncode == 0, done.stderr
    status = farm / "ipc" / "temp" / "host_status.json"
    wait_for(lambda: json.loads(status.read_text())["status"] == "stopped", what="temp to be detached")
    # Main's snapshot is rewritten on its own after the detach (it failed once read right after it).
    wait_for(
        lambda: "telegram:330" not in {g["jid"] for g in available(farm, "main")["groups"]},
        what="main's available_groups.json without the removed chat",
        seen=lambda: available(farm, "main"),
    )


def test_a_removed_groups_folder_is_never_registered_for_another_chat_by_an_agent(farm: Path) -> None:
    assert register(farm, "main", jid="telegram:340", name="Old shed", folder="shed")["status"] == "success"
    task = {"type": "schedule_task", "prompt": "shed secret", "schedule_type": "interval", "schedule_value": "3600000"}
    assert ask(farm, "shed", "tasks", task)["status"] == "success"
    (farm / "groups" / "shed" / "MEMORY.md").write_text("the shed's private notes\n")
    assert farmhost("group", "remove", "shed", data_dir=farm).returncode == 0
    # main's agent (talked into it) binds a stranger's chat to the removed group's folder
    result = register(farm, "main", jid="telegram:341", name="Stranger", folder="shed")
    assert (result["status"], result["errorCode"]) == ("error", "conflict"), result
    assert (
        "removed earlier" in result["error"] and "1 task" in result["error"] and "farmhost group add" in result["error"]
    )
    assert _db_rows(farm, "SELECT folder FROM groups WHERE jid = 'telegram:341'") == []
    # the operator may still give the folder back (to the same chat or, knowingly, another)
    added = farmhost("group", "add", "--jid", "telegram:340", "--name", "Old shed", "--folder", "shed", data_dir=farm)
    assert added.returncode == 0, added.stderr


def test_a_removed_groups_stored_results_keep_its_folder_even_when_its_directories_are_gone(farm: Path) -> None:
    assert register(farm, "main", jid="telegram:350", name="Loft", folder="loft")["status"] == "success"
    drop(farm, "loft", "actions", {"type": "ping", "requestId": "r-1"})  # the kind of id the next agent uses too
    assert wait_result(farm, "loft", "r-1")["status"] == "success"
    assert farmhost("group", "remove", "loft", data_dir=farm).returncode == 0
    wait_for(lambda: json.loads((farm / "ipc" / "loft" / "host_status.json").read_text())["status"] == "stopped")
    shutil.rmtree(farm / "ipc" / "loft")
    shutil.rmtree(farm / "groups" / "loft")
    result = register(farm, "main", jid="telegram:351", name="Stranger", folder="loft")
    assert (result["status"], result["errorCode"]) == ("error", "conflict"), result
    assert "1 answered request" in result["error"] and "workspace" not in result["error"]


def _log(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "logs" / "requests.ndjson"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_request_log_has_one_line_per_processed_request(farm: Path) -> None:
    drop(farm, "field", "actions", {"type": "ping", "requestId": "log-ping"})
    drop(farm, "field", "messages", {"type": "message", "requestId": "log-deny", "chatJid": MAIN_JID, "text": "x"})
    drop(farm, "main", "tasks", {"type": "cancel_task", "requestId": "log-missing", "taskId": "nope"})
    drop(farm, "main", "actions", b"{not json", name="log-bad.json")
    expected = {
        "log-ping": ("field", "actions", "ping", "success", None),
        "log-deny": ("field", "messages", "message", "error", "unauthorized"),
        "log-missing": ("main", "tasks", "cancel_task", "error", "not_found"),
        "log-bad": ("main", "actions", None, "quarantined", "invalid_request"),
    }
    for rid, (folder, *_) in expected.items():
        wait_result(farm, folder, rid)

    def mine() -> list[dict[str, Any]]:
        return [line for line in _log(farm) if line.get("requestId") in expected]

    wait_for(lambda: len(mine()) >= len(expected), what="the request log lines")
    lines = {line["requestId"]: line for line in mine()}
    assert len(mine()) == len(lines) == len(expected)
    for rid, (group, queue, kind, status, code) in expected.items():
        line = lines[rid]
        got = (line["group"], line["queue"], line["type"], line["status"], line["errorCode"])
        assert got == (group, queue, kind, status, code), line
        assert isinstance(line["durationMs"], int | float) and line["durationMs"] >= 0, line
        assert line["ts"].endswith("Z")
    # Where each answered request's time went (bench/request_phases.py reads them); a quarantined file has none.
    assert "phasesUs" not in lines["log-bad"], lines["log-bad"]
    ping = lines["log-ping"]["phasesUs"]
    assert list(ping) == ["claim", "read", "decode", "ledger", "handler", "envelope", "result", "log"], ping
    assert all(isinstance(us, int) and us >= 0 for us in ping.values()), ping
    # The phases from the read to the published result are inside the request's durationMs (each rounded to 1 us).
    inside = sum(us for phase, us in ping.items() if phase not in ("claim", "log"))
    assert inside <= lines["log-ping"]["durationMs"] * 1000 + len(ping), lines["log-ping"]
    assert "settle" in lines["log-missing"]["phasesUs"], lines["log-missing"]  # a STATE request, even refused
