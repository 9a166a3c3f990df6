"""The request ledger seen from outside: one execution per (group, requestId), replays, independent groups."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, drop, result_path, wait_for, wait_result

SCHEDULE = {"type": "schedule_task", "prompt": "water the beds", "schedule_type": "interval", "schedule_value": 3600000}


def _rows(data_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


def _log_lines(data_dir: Path, rid: str) -> list[dict[str, Any]]:
    path = data_dir / "logs" / "requests.ndjson"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if line.get("requestId") == rid]


def _queues_empty(data_dir: Path, folder: str) -> bool:
    return not any(any((data_dir / "ipc" / folder / q).iterdir()) for q in ("messages", "tasks", "actions"))


def test_same_id_in_three_queues_of_one_group_runs_once(data_dir: Path) -> None:
    # All three are waiting when the host starts, so the three queue workers race for the id.
    drop(data_dir, "main", "actions", {"type": "ping", "requestId": "dup-1"})
    drop(data_dir, "main", "tasks", {**SCHEDULE, "requestId": "dup-1", "taskId": "dup-1"})
    drop(
        data_dir, "main", "messages", {"type": "message", "requestId": "dup-1", "chatJid": "telegram:100", "text": "x"}
    )
    daemon = Daemon(data_dir).start()
    try:
        wait_for(lambda: len(_log_lines(data_dir, "dup-1")) == 3, what="three answers for dup-1")
        assert _queues_empty(data_dir, "main")
        lines = _log_lines(data_dir, "dup-1")
        assert sorted(line["queue"] for line in lines) == ["actions", "messages", "tasks"]
        assert [line["replayed"] for line in lines].count(False) == 1
        result = wait_result(data_dir, "main", "dup-1")
        assert result["status"] == "success"
        # Every file got the winner's result, and only the winner left a trace in the store.
        assert {line["type"] for line in lines} == {result["type"]}
        tasks = _rows(data_dir, "SELECT id FROM tasks")
        outbox = _rows(data_dir, "SELECT message_key FROM outbox")
        assert tasks == ([("dup-1",)] if result["type"] == "schedule_task" else [])
        assert outbox == ([("ipc:main:dup-1",)] if result["type"] == "message" else [])
    finally:
        assert daemon.stop() == 0


def test_a_later_file_with_a_used_id_gets_the_stored_result_unexecuted(daemon: Daemon) -> None:
    data_dir = daemon.data_dir
    drop(data_dir, "field", "tasks", {**SCHEDULE, "requestId": "seq-1", "taskId": "seq-1"})
    first = wait_result(data_dir, "field", "seq-1")
    assert first["status"] == "success"
    replays = [
        ("tasks", {**SCHEDULE, "requestId": "seq-1", "taskId": "seq-1"}),  # the same request again: not a conflict
        ("messages", {"type": "message", "requestId": "seq-1", "chatJid": "telegram:200", "text": "hello"}),
        ("actions", {"type": "ping", "requestId": "seq-1"}),
    ]
    for queue, payload in replays:
        result_path(data_dir, "field", "seq-1").unlink()
        drop(data_dir, "field", queue, payload)
        assert wait_result(data_dir, "field", "seq-1") == first
    wait_for(lambda: _queues_empty(data_dir, "field"), what="field queues to empty")
    assert _rows(data_dir, "SELECT count(*) FROM outbox") == [(0,)]
    assert _rows(data_dir, "SELECT id, group_folder FROM tasks") == [("seq-1", "field")]
    # The request log line is written just after the result is published: wait for the last one.
    replayed = wait_for(
        lambda: r if len(r := [line["replayed"] for line in _log_lines(data_dir, "seq-1")]) == 4 else None,
        what="four request log lines for seq-1",
    )
    assert replayed == [False, True, True, True]


def test_the_same_id_in_two_groups_is_two_requests(daemon: Daemon) -> None:
    data_dir = daemon.data_dir
    for folder, jid in (("main", "telegram:100"), ("field", "telegram:200")):
        drop(data_dir, folder, "messages", {"type": "message", "requestId": "same-1", "chatJid": jid, "text": folder})
        drop(data_dir, folder, "tasks", {**SCHEDULE, "requestId": "same-2"})
    for folder in ("main", "field"):
        assert wait_result(data_dir, folder, "same-1")["status"] == "success"
        assert wait_result(data_dir, folder, "same-2")["status"] == "success"
    keys = _rows(data_dir, "SELECT message_key, chat_jid, body FROM outbox ORDER BY message_key")
    assert keys == [("ipc:field:same-1", "telegram:200", "field"), ("ipc:main:same-1", "telegram:100", "main")]
    tasks = _rows(data_dir, "SELECT group_folder FROM tasks ORDER BY group_folder")
    assert tasks == [("field",), ("main",)]
    main_task = wait_result(data_dir, "main", "same-2")["result"]["taskId"]
    assert main_task != wait_result(data_dir, "field", "same-2")["result"]["taskId"]
    ledger = _rows(data_dir, "SELECT folder, request_id, state FROM request_ledger WHERE request_id LIKE 'same-%'")
    assert sorted(ledger) == [(f, r, "done") for f in ("field", "main") for r in ("same-1", "same-2")]


def test_a_request_without_a_usable_id_gets_a_generated_one_per_file(daemon: Daemon) -> None:
    data_dir = daemon.data_dir
    results = data_dir / "ipc" / "field" / "action_results"
    payload = {"type": "message", "chatJid": "telegram:200", "text": "no id here"}
    seen: set[str] = set()
    for _ in range(2):  # the same name and content twice: two files, two requests
        drop(data_dir, "field", "messages", payload, name="note 1.json")
        new = wait_for(lambda: {p.stem for p in results.glob("gen-*.json")} - seen, what="a generated-id result")
        [rid] = new
        assert json.loads((results / f"{rid}.json").read_text())["status"] == "success"
        seen.add(rid)
    keys = _rows(data_dir, "SELECT message_key FROM outbox WHERE source_folder = 'field'")
    assert sorted(keys) == sorted((f"ipc:field:{rid}",) for rid in seen) and len(seen) == 2
