"""`farmhost init` and `farmhost group add|list|remove`: the layout, the folder rules, the one main group."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from farmhost_testing import FIELD_JID, MAIN_JID, drop, farmhost, ok, running_daemon, wait_result

QUEUES = ("messages", "tasks", "actions", "action_results")
GROUP_KEYS = {"jid", "name", "folder", "trigger", "requiresTrigger", "isMain", "addedAt"}


def _groups(data_dir: Path) -> list[dict[str, object]]:
    done = farmhost("group", "list", "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert isinstance(listed, list)
    return listed


def _refused(done: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for phrase in phrases:
        assert phrase in done.stderr, f"{phrase!r} not in {done.stderr!r}"


def test_init_creates_the_layout_and_is_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "data"
    done = farmhost("init", data_dir=root)
    assert done.returncode == 0, done.stderr
    assert str(root) in done.stdout
    assert "farmhost group add" in done.stdout  # says what to do next
    for sub in ("ipc", "ipc/errors", "groups", "farm-state", "logs"):
        assert (root / sub).is_dir(), sub
    assert (root / "farmhost.db").read_bytes()[:16] == b"SQLite format 3\x00"
    with sqlite3.connect(root / "farmhost.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    marker = root / "groups" / "keep.txt"
    marker.write_text("operator file")
    again = farmhost("init", data_dir=root)
    assert again.returncode == 0, again.stderr
    assert marker.read_text() == "operator file"
    assert _groups(root) == []
    empty = farmhost("group", "list", data_dir=root)
    assert "no groups" in empty.stdout and "--main" in empty.stdout


def test_group_add_creates_workspace_and_queues_and_lists(data_dir: Path) -> None:
    for folder in ("main", "field"):
        assert (data_dir / "groups" / folder).is_dir()
        for queue in QUEUES:
            assert (data_dir / "ipc" / folder / queue).is_dir(), f"{folder}/{queue}"
    listed = {g["folder"]: g for g in _groups(data_dir)}
    assert set(listed) == {"main", "field"}
    assert all(set(g) == GROUP_KEYS for g in listed.values())
    assert listed["main"]["isMain"] is True and listed["main"]["jid"] == MAIN_JID
    assert listed["field"]["isMain"] is False and listed["field"]["jid"] == FIELD_JID
    assert listed["field"]["name"] == "Field crew"
    assert listed["field"]["trigger"] == "@Field" and listed["field"]["requiresTrigger"] is True
    text = farmhost("group", "list", data_dir=data_dir)
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].split()[:3] == ["FOLDER", "MAIN", "JID"]
    main_line = next(line for line in lines if line.startswith("main "))
    assert " yes " in main_line and MAIN_JID in main_line and "Farm office" in main_line
    assert any(line.startswith("field ") and FIELD_JID in line for line in lines)
    # Every option of `group add`.
    options = ("--jid=telegram:-1001234", "--name=Dairy barn", "--folder=Dairy_2", "--trigger=@cows")
    done = farmhost("group", "add", *options, "--no-trigger-required", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert "Dairy_2" in done.stdout and str(data_dir / "groups" / "Dairy_2") in done.stdout
    dairy = next(g for g in _groups(data_dir) if g["folder"] == "Dairy_2")
    assert dairy == {**dairy, "trigger": "@cows", "requiresTrigger": False, "isMain": False, "name": "Dairy barn"}


def test_refused_registrations(data_dir: Path) -> None:
    other = ("--jid=telegram:300", "--name=Other", "--folder=other")
    done = farmhost("group", "add", *other, "--main", data_dir=data_dir)
    _refused(done, "main group already exists", "'main'", "remove")
    assert [g["folder"] for g in _groups(data_dir) if g["isMain"]] == ["main"]
    assert "other" not in {g["folder"] for g in _groups(data_dir)}
    assert not (data_dir / "ipc" / "other").exists()
    # Folder rules and duplicates: each refused with one line that says which rule.
    rule = "1-64 letters, digits, '_' or '-'"
    table = [
        # (jid, folder, phrases the one-line refusal contains)
        ("telegram:301", "global", ("'global'", "reserved")),
        ("telegram:302", "Errors", ("'Errors'", "reserved")),
        ("telegram:303", "../x", ("'../x'", rule)),
        ("telegram:304", "a b", ("'a b'", rule)),
        ("telegram:305", "a" * 65, (rule,)),
        ("telegram:306", "", (rule,)),
        (FIELD_JID, "field2", (FIELD_JID, "already registered", "'field'")),
        ("telegram:308", "field", ("'field'", "already used")),
        ("telegram:309", "FIELD", ("'FIELD'", "already used", "field")),
        ("no-colon", "fine", ("jid", "telegram:")),
        # another spelling of field's chat would bind a second group to it (its messages land in field's chat)
        ("telegram:0200", "ghost", ("'telegram:0200'", "telegram:200")),
        ("telegram:-0", "ghost2", ("'telegram:-0'", "chat id")),
        ("telegram:two", "ghost3", ("'telegram:two'", "chat id")),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = pool.map(
            lambda row: farmhost(
                "group", "add", f"--jid={row[0]}", "--name=X", f"--folder={row[1]}", data_dir=data_dir
            ),
            table,
        )
        for (_, _, phrases), done in zip(table, runs, strict=True):
            _refused(done, *phrases)
    assert {g["folder"] for g in _groups(data_dir)} == {"main", "field"}
    assert sorted(p.name for p in (data_dir / "ipc").iterdir() if not p.name.startswith(".")) == [
        "errors",
        "field",
        "main",
    ]
    assert not (data_dir / "x").exists() and not (data_dir / "groups" / "global").exists()
    # Without --main the group refused above is fine.
    ok = farmhost("group", "add", *other, data_dir=data_dir)
    assert ok.returncode == 0, ok.stderr


def test_group_remove_keeps_files(data_dir: Path) -> None:
    memory = data_dir / "groups" / "field" / "MEMORY.md"
    memory.write_text("# Field crew\n")
    pending = data_dir / "ipc" / "field" / "messages" / "0001.json"
    pending.write_text("{}")
    done = farmhost("group", "remove", "field", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert "kept" in done.stdout
    assert [g["folder"] for g in _groups(data_dir)] == ["main"]
    assert memory.read_text() == "# Field crew\n"
    assert pending.read_text() == "{}"
    for queue in QUEUES:
        assert (data_dir / "ipc" / "field" / queue).is_dir()
    _refused(farmhost("group", "remove", "field", data_dir=data_dir), "no group", "'field'", "group list")
    # The chat and folder are free again, and the kept workspace is reused.
    again = farmhost("group", "add", "--jid", FIELD_JID, "--name", "Field crew", "--folder", "field", data_dir=data_dir)
    assert again.returncode == 0, again.stderr
    assert memory.read_text() == "# Field crew\n"
    assert (
        "reused:    a workspace (groups/field/), an IPC directory (ipc/field/) left by a group removed" in again.stdout
    )


def test_a_removed_groups_undelivered_messages_are_dropped_not_sent_to_its_chat(data_dir: Path) -> None:
    with running_daemon(data_dir):  # no Telegram: what the agents send waits in the outbox
        for n in (1, 2):
            drop(
                data_dir,
                "field",
                "messages",
                {"type": "message", "requestId": f"m-{n}", "chatJid": FIELD_JID, "text": f"row {n} is dry"},
            )
            ok(wait_result(data_dir, "field", f"m-{n}"))
        drop(
            data_dir,
            "main",
            "messages",
            {"type": "message", "requestId": "m-main", "chatJid": MAIN_JID, "text": "the office is open"},
        )
        ok(wait_result(data_dir, "main", "m-main"))
        done = farmhost("group", "remove", "field", data_dir=data_dir)  # while the daemon runs
    assert done.returncode == 0, done.stderr
    assert "dropped:   2 undelivered message chunk(s) of the group will not be sent" in done.stdout
    with sqlite3.connect(data_dir / "farmhost.db") as conn:
        rows = conn.execute("SELECT source_folder, status, last_error FROM outbox ORDER BY id").fetchall()
    assert rows == [
        ("field", "failed", "its group was removed before it was sent"),
        ("field", "failed", "its group was removed before it was sent"),
        ("main", "pending", None),
    ]
