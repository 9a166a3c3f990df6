"""Authorisation of every request type from the main and a non-main group, against the real daemon."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import FIELD_JID, MAIN_JID, drop, wait_result
from ipc_support import (
    UNREGISTERED_JID,
    Env,
    groups,
    outbox,
    ping_ok,
    uid,
    wait_note,
)

OWN_JID = {"main": MAIN_JID, "field": FIELD_JID}
OTHER = {"main": "field", "field": "main"}
SUCCESS = None


@dataclass(frozen=True)
class Case:
    """One row: who sends what, and the errorCode expected (None: success)."""

    source: str
    queue: str
    payload: dict[str, Any]
    code: str | None
    task_of: str | None = None  # a fresh task of this group is created first; its id goes into `taskId`
    task_paused: bool = False


def _message(kind: str, source: str, target: str, code: str | None) -> Any:
    chat = {"own": OWN_JID[source], "other": OWN_JID[OTHER[source]], "unregistered": UNREGISTERED_JID}[target]
    body = {"text": f"hello from {source}"} if kind == "message" else {"path": "note.txt", "caption": "a note"}
    payload = {"type": kind, "chatJid": chat, **body}
    return pytest.param(Case(source, "messages", payload, code), id=f"{source}-{kind}-{target}-chat")


def _schedule(source: str, target: str, code: str | None) -> Any:
    folder = {"self": None, "other": OTHER[source], "unknown": "nowhere"}[target]
    payload: dict[str, Any] = {"type": "schedule_task", "prompt": "check the pumps", "schedule_type": "interval"}
    payload["schedule_value"] = 3_600_000
    if folder:
        payload["groupFolder"] = folder
    return pytest.param(Case(source, "tasks", payload, code), id=f"{source}-schedule_task-{target}")


def _task_change(op: str, source: str, owner: str, code: str | None) -> Any:
    case = Case(source, "tasks", {"type": op}, code, task_of=owner, task_paused=op == "resume_task")
    whose = "own" if owner == source else "other"
    return pytest.param(case, id=f"{source}-{op}-{whose}-task")


def _register(source: str, folder: str, code: str | None, label: str, **extra: Any) -> Any:
    payload: dict[str, Any] = {"type": "register_group", "name": "Barn crew", "folder": folder, **extra}
    return pytest.param(Case(source, "tasks", payload, code), id=f"{source}-register_group-{label}")


def _simple(source: str, queue: str, payload: dict[str, Any], code: str | None, label: str) -> Any:
    return pytest.param(Case(source, queue, payload, code), id=f"{source}-{label}")


FARM = {"type": "farm_action", "action": "ha_get_status", "params": {}}
CONTROL = {
    "type": "farm_action",
    "action": "ha_call_service",
    "params": {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.pump"}},
}
GET = {"type": "memory_action", "action": "memory_get", "params": {"path": "MEMORY.md"}}
SEARCH = {"type": "memory_action", "action": "memory_search", "params": {"query": "pump"}}

CASES = [
    # messages/: main may reach every registered chat, a non-main group only its own
    *(_message(kind, "main", target, code) for kind in ("message", "file")
      for target, code in (("own", SUCCESS), ("other", SUCCESS), ("unregistered", "unauthorized"))),
    *(_message(kind, "field", target, code) for kind in ("message", "file")
      for target, code in (("own", SUCCESS), ("other", "unauthorized"), ("unregistered", "unauthorized"))),
    # tasks/: schedule_task for itself, for another group, for an unknown folder
    _schedule("main", "self", SUCCESS),
    _schedule("main", "other", SUCCESS),
    _schedule("main", "unknown", "not_found"),
    _schedule("field", "self", SUCCESS),
    _schedule("field", "other", "unauthorized"),
    _schedule("field", "unknown", "unauthorized"),
    # pause/resume/cancel: own tasks only, unless main
    *(_task_change(op, source, owner, SUCCESS if source == "main" or owner == source else "unauthorized")
      for op in ("pause_task", "resume_task", "cancel_task")
      for source in ("main", "field")
      for owner in ("main", "field")),
    # register_group / refresh_groups: main only; isMain never settable; folder validated
    _register("main", "@new", SUCCESS, "ok"),
    _register("field", "@new", "unauthorized", "from-non-main"),
    _register("main", "@new", "invalid_request", "isMain-true", isMain=True),
    _register("main", "@new64", SUCCESS, "folder-of-64-chars"),
    _register("field", "@new", "invalid_request", "isMain-from-non-main", isMain=True),
    *(_register("main", folder, "invalid_request", f"reserved-{folder}")
      for folder in ("global", "GLOBAL", "Global", "errors", "ERRORS", "eRRors")),
    *(_register("main", folder, "invalid_request", f"bad-{label}")
      for label, folder in (("slash", "a/b"), ("dotdot", ".."), ("dot", "a.b"), ("space", "a b"),
                            ("leading-dash", "-abc"), ("unicode", "fëld"), ("nul", "a\x00b"), ("empty", ""),
                            ("too-long", "a" * 65))),
    _register("main", "field", "conflict", "taken-folder"),
    _register("main", "FIELD", "conflict", "taken-folder-other-case"),
    _simple("main", "tasks", {"type": "refresh_groups"}, SUCCESS, "refresh_groups"),
    _simple("field", "tasks", {"type": "refresh_groups"}, "unauthorized", "refresh_groups"),
    # actions/: farm_action main only (HA is not configured here), memory own folder unless main, ping anyone
    _simple("main", "actions", FARM, "upstream_unavailable", "farm_action"),
    _simple("field", "actions", FARM, "unauthorized", "farm_action"),
    _simple("main", "actions", CONTROL, "upstream_unavailable", "farm_action-control"),
    _simple("field", "actions", CONTROL, "unauthorized", "farm_action-control"),
    _simple("field", "actions", {**SEARCH, "groupFolder": "main"}, "unauthorized", "memory_search-other-folder"),
    _simple("field", "actions", {**GET, "groupFolder": "main"}, "unauthorized", "memory_get-other-folder"),
    _simple("main", "actions", {"type": "ping"}, SUCCESS, "ping"),
    _simple("field", "actions", {"type": "ping"}, SUCCESS, "ping"),
]  # fmt: skip


def _make_task(data_dir: Path, owner: str, *, paused: bool) -> str:
    task_id = uid("task")
    rid = uid("setup")
    drop(
        data_dir,
        owner,
        "tasks",
        {
            "type": "schedule_task",
            "requestId": rid,
            "taskId": task_id,
            "prompt": "water the seedlings",
            "schedule_type": "cron",
            "schedule_value": "0 6 * * *",
        },
    )
    assert wait_result(data_dir, owner, rid)["status"] == "success"
    if paused:
        rid = uid("setup")
        drop(data_dir, owner, "tasks", {"type": "pause_task", "taskId": task_id, "requestId": rid})
        assert wait_result(data_dir, owner, rid)["status"] == "success"
    return task_id


def _snapshot(data_dir: Path, name: str) -> Any:
    return json.loads((data_dir / "ipc" / "main" / name).read_bytes())


def _task(data_dir: Path, task_id: str) -> dict[str, Any] | None:
    """The task as main's `current_tasks.json` shows it (main sees every group's active and paused tasks)."""
    return next((t for t in _snapshot(data_dir, "current_tasks.json") if t["id"] == task_id), None)


@pytest.mark.parametrize("case", CASES)
def test_authorisation_matrix(env: Env, case: Case) -> None:
    data_dir = env.data_dir
    payload = dict(case.payload)
    before: dict[str, Any] | None = None
    if case.task_of:
        payload["taskId"] = _make_task(data_dir, case.task_of, paused=case.task_paused)
        before = _task(data_dir, payload["taskId"])
    if payload["type"] == "register_group":
        suffix = uid("g")[2:]
        payload["jid"] = f"telegram:-{int(suffix, 16)}"
        if payload["folder"] == "@new":
            payload["folder"] = f"barn{suffix}"
        elif payload["folder"] == "@new64":
            payload["folder"] = f"barn{suffix}".ljust(64, "x")
    if payload["type"] == "schedule_task":
        payload["taskId"] = uid("task")
    rid = uid(case.source)
    payload["requestId"] = rid
    drop(data_dir, case.source, case.queue, payload)

    result = wait_result(data_dir, case.source, rid)
    assert result["requestId"] == rid
    assert result["type"] == payload["type"]
    assert result["action"] == payload.get("action")
    if case.code is SUCCESS:
        assert result["status"] == "success", result
        assert result["error"] is None and result["errorCode"] is None
    else:
        assert result["status"] == "error", result
        assert result["errorCode"] == case.code, result
        assert isinstance(result["error"], str) and len(result["error"]) > 10
        assert result["result"] is None
    kind = payload["type"]
    if kind == "schedule_task":
        _check_schedule(data_dir, case, payload, result)
    elif kind in ("pause_task", "resume_task", "cancel_task"):
        _check_task_change(data_dir, case, payload, before)
    elif kind == "register_group":
        _check_register(env, case, payload, result)
    elif kind in ("message", "file") and case.code:
        assert payload["chatJid"] in result["error"]
    ping_ok(data_dir, case.source)


def test_refused_messages_reach_no_outbox(env: Env) -> None:
    """Every message/file row of the table again, at once: only the authorised ones are in the outbox."""
    data_dir = env.data_dir
    sent: dict[str, tuple[Case, dict[str, Any]]] = {}
    for param in CASES:
        case = param.values[0]
        if case.queue == "messages":
            rid = uid(f"{case.source}-out")
            payload = {**case.payload, "requestId": rid}
            drop(data_dir, case.source, case.queue, payload)
            sent[rid] = (case, payload)
    for rid, (case, _) in sent.items():
        assert wait_result(data_dir, case.source, rid)["errorCode"] == case.code
    entries = {e["messageKey"].rsplit(":", 1)[-1]: e for e in outbox(data_dir)}
    for rid, (case, payload) in sent.items():
        if case.code is SUCCESS:
            assert entries[rid]["chatJid"] == payload["chatJid"]
            assert entries[rid]["sourceFolder"] == case.source
            assert entries[rid]["kind"] == ("text" if payload["type"] == "message" else "file")
        else:
            assert rid not in entries, f"refused {payload} reached the outbox"
    assert UNREGISTERED_JID not in {e["chatJid"] for e in entries.values()}


def _check_schedule(data_dir: Path, case: Case, payload: dict[str, Any], result: dict[str, Any]) -> None:
    task = _task(data_dir, payload["taskId"])
    if case.code is SUCCESS:
        assert result["result"]["taskId"] == payload["taskId"]
        assert task is not None and task["groupFolder"] == payload.get("groupFolder", case.source)
        assert task["status"] == "active"
    else:
        assert task is None, "a refused schedule_task must not create a task"


def _check_task_change(data_dir: Path, case: Case, payload: dict[str, Any], before: dict[str, Any] | None) -> None:
    assert before is not None
    after = _task(data_dir, payload["taskId"])
    if case.code is not SUCCESS:
        assert after == before, "a refused task change must leave the task as it was"
    elif payload["type"] == "cancel_task":
        assert after is None, "a cancelled task leaves current_tasks.json"
    else:
        assert after is not None
        assert after["status"] == ("paused" if payload["type"] == "pause_task" else "active")


def _check_register(env: Env, case: Case, payload: dict[str, Any], result: dict[str, Any]) -> None:
    data_dir, folder = env.data_dir, payload["folder"]
    listed = {g["jid"]: g for g in _snapshot(data_dir, "available_groups.json")["groups"]}
    if case.code is SUCCESS:
        assert result["result"]["folder"] == folder
        assert result["result"]["isMain"] is False
        assert listed[payload["jid"]]["folder"] == folder and listed[payload["jid"]]["isRegistered"] is True
        for sub in ("messages", "tasks", "actions", "action_results"):
            assert (data_dir / "ipc" / folder / sub).is_dir()
        assert (data_dir / "groups" / folder).is_dir()
        ping_ok(data_dir, folder)  # the running daemon serves the new group
        return
    assert payload["jid"] not in listed
    if case.code == "conflict":
        assert "already used" in result["error"]
    elif case.code == "invalid_request":
        # Refused at validation: the file is quarantined with a reason that names the problem.
        note = wait_note(data_dir, case.source, f"{payload['requestId']}.json", queue="tasks")
        assert note["errorCode"] == "invalid_request"
        assert note["reason"] in result["error"]
        if "isMain" in payload:
            assert "isMain cannot be set through IPC" in note["reason"]
            assert [g["folder"] for g in groups(data_dir).values() if g["isMain"]] == ["main"]
        elif folder.lower() in ("global", "errors"):
            assert "reserved" in note["reason"]
        else:
            assert re.search(r"not valid|at most 64|at least 1", note["reason"]), note
        bad = folder.replace("\x00", "")
        if bad and "/" not in bad and bad != "..":
            # groups/global/ is the global memory the host seeds itself; the refusal must not register it.
            assert bad == "global" or not (data_dir / "groups" / bad).exists(), "a refused folder must not be created"
            assert bad.lower() == "errors" or not (data_dir / "ipc" / bad).exists()
