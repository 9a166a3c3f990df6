"""Hostile request files against the real daemon: bad ids, links, odd file types, sizes, malformed JSON, floods."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import read_result, scaled, wait_for, wait_result
from ipc_support import (
    Env,
    ping_ok,
    quarantined_entry,
    tree,
    uid,
    wait_logged,
    wait_note,
    wait_quarantined,
    write_raw,
)

from farmhost.ipc.quarantine import KEEP_BYTES
from farmhost.protocol.catalog import ACTION_PARAMS

LIMIT = 1024 * 1024  # FARMHOST_IPC_MAX_REQUEST_BYTES default


def _queue(env: Env, folder: str = "field", queue: str = "actions") -> Path:
    return env.data_dir / "ipc" / folder / queue


def _assert_logged_quarantine(env: Env, folder: str, queue: str, name: str, reason: str) -> None:
    line = f"quarantined {folder}/{queue}/{name}: {reason}"
    wait_for(lambda: line in env.daemon.log(), what=f"daemon log line {line!r}")


def _assert_error_result(env: Env, folder: str, request_id: str, reason: str) -> dict[str, Any]:
    result = wait_result(env.data_dir, folder, request_id)
    assert result["requestId"] == request_id
    assert result["status"] == "error" and result["errorCode"] == "invalid_request", result
    assert reason in result["error"], result
    assert result["result"] is None
    return result


# requestId and traversal ---------------------------------------------------------------------------------------

BAD_IDS = {
    "dotdot-x": "../x",
    "dotdot": "..",
    "deep-dotdot": "../../../../../../tmp/owned",
    "absolute": "/etc/passwd",
    "slash": "a/b",
    "dot-slash": "a/../../b",
    "len-129": "a" * 129,
    "unicode": "résumé",
    "nul": "a\x00b",
    "newline": "a\nb",
    "leading-dot": ".hidden",
    "leading-dash": "-x",
    "space": "a b",
    "empty": "",
    "number": 5,
    "list": ["a"],
}

# What the daemon may add anywhere under the test's tmp dir while refusing a bad id.
_ALLOWED_NEW = re.compile(
    r"data/ipc/errors/field(/.*)?|data/logs(/.*)?|data/farmhost\.db.*|data/ipc/field/action_results/alive-\w+\.json"
    r"|data/ipc/field/action_results/trav-\w+\.json|daemon\.log|.*/\.[^/]*\.tmp"
)


@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_bad_request_id_is_quarantined_and_writes_nothing_outside(env: Env, bad: Any) -> None:
    root = env.data_dir.parent
    before = tree(root)
    name = f"{uid('trav')}.json"
    raw = json.dumps({"type": "ping", "requestId": bad}).encode()
    write_raw(_queue(env), name, raw)

    note = wait_note(env.data_dir, "field", name)
    assert note["errorCode"] == "invalid_request"
    assert "requestId must match" in note["reason"], note
    # The file's stem is a valid id: the agent is answered under it (SPEC §4), with the same reason.
    _assert_error_result(env, "field", name[: -len(".json")], note["reason"])
    assert quarantined_entry(env.data_dir, "field", "actions", name).read_bytes() == raw, "quarantine keeps the bytes"
    _assert_logged_quarantine(env, "field", "actions", name, note["reason"])
    ping_ok(env.data_dir, "field")

    new = {p for p in tree(root) - before if not _ALLOWED_NEW.fullmatch(p)}
    assert new == set(), f"files created outside the quarantine: {sorted(new)}"
    for escaped in (Path("/etc/passwd.json"), Path("/tmp/owned.json"), root / "x.json", root / "data" / "x.json"):
        assert not escaped.exists()
    assert not (_queue(env) / name).exists()


def test_request_id_of_128_chars_is_accepted(env: Env) -> None:
    rid = "a" + secrets.token_hex(8) + "b" * 111
    assert len(rid) == 128
    write_raw(_queue(env), "long-id.json", json.dumps({"type": "ping", "requestId": rid}).encode())
    assert wait_result(env.data_dir, "field", rid)["status"] == "success"


BAD_STEMS = {
    "leading-dash": "-dash.json",
    "space": "with space.json",
    "unicode": "ünïcode.json",
    "too-long": "s" * 129 + ".json",
    "at-sign": "x@y.json",
    "not-utf8": os.fsdecode(b"\xff\xfe-bytes.json"),
}


@pytest.mark.parametrize("name", list(BAD_STEMS.values()), ids=list(BAD_STEMS))
def test_file_stem_that_is_not_an_id_gets_a_generated_id(env: Env, name: str) -> None:
    write_raw(_queue(env), name, b'{"type": "ping"}')
    [record] = wait_logged(env.data_dir, file=name)
    rid = record["requestId"]
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", rid) and rid != name[: -len(".json")]
    assert record["status"] == "success"
    assert wait_result(env.data_dir, "field", rid)["status"] == "success"
    results = os.listdir(env.data_dir / "ipc" / "field" / "action_results")
    assert name not in results, "no result may be named after an invalid stem"


# links and odd file types ----------------------------------------------------------------------------------------


def _place_like_agent(queue_dir: Path, name: str, make: Any) -> None:
    """Create an entry at a temp name with `make(path)`, then rename it into the queue (inotify sees it at once)."""
    tmp = queue_dir / f".{secrets.token_hex(4)}.tmp"
    make(tmp)
    os.rename(tmp, queue_dir / name)


def _fingerprint(path: Path) -> tuple[bytes, int, int, int]:
    info = os.stat(path)
    return path.read_bytes(), info.st_mtime_ns, info.st_ino, info.st_nlink


def test_symlinked_request_files_are_quarantined_unread(env: Env) -> None:
    data_dir = env.data_dir
    other_result = uid("main-secret")
    ping = {"type": "ping", "requestId": other_result}
    write_raw(_queue(env, "main"), f"{other_result}.json", json.dumps(ping).encode())
    wait_result(data_dir, "main", other_result)
    targets = {
        "passwd": Path("/etc/passwd"),
        "other-workspace": data_dir / "groups" / "main" / "note.txt",
        "other-result": data_dir / "ipc" / "main" / "action_results" / f"{other_result}.json",
    }
    before = {label: _fingerprint(target) for label, target in targets.items()}
    names = {}
    for label, target in targets.items():
        names[label] = uid(f"sym-{label}")
        link = os.path.relpath(target, _queue(env)) if label == "other-result" else str(target)
        _place_like_agent(_queue(env), f"{names[label]}.json", lambda p, link=link: os.symlink(link, p))

    reason = "request file is a symlink; only regular files are read"
    for label, rid in names.items():
        note = wait_note(data_dir, "field", f"{rid}.json")
        assert note["reason"] == reason
        entry = quarantined_entry(data_dir, "field", "actions", f"{rid}.json")
        assert entry.is_symlink(), "the link itself is quarantined, never its target"
        _assert_error_result(env, "field", rid, reason)
        _assert_logged_quarantine(env, "field", "actions", f"{rid}.json", reason)
        assert _fingerprint(targets[label]) == before[label], f"{label} target was touched"
    ping_ok(data_dir, "field")


def test_hard_linked_request_files_are_quarantined(env: Env) -> None:
    data_dir = env.data_dir
    # A valid request the agent may not send as-is: a hard link to it, and one to another group's file.
    own = data_dir / "groups" / "field" / "linked.json"
    own.write_text(json.dumps({"type": "ping"}))
    other = data_dir / "groups" / "main" / "note.txt"
    for source in (own, other):
        before = _fingerprint(source)
        rid = uid("hardlink")
        _place_like_agent(_queue(env), f"{rid}.json", lambda p, source=source: os.link(source, p))
        note = wait_note(data_dir, "field", f"{rid}.json")
        assert note["reason"] == "request file has 2 hard links; write a new file instead of linking one"
        _assert_error_result(env, "field", rid, note["reason"])
        content, mtime, ino, _ = _fingerprint(source)
        assert (content, mtime, ino) == before[:3], "the linked file must be left as it was"
        assert quarantined_entry(data_dir, "field", "actions", f"{rid}.json").stat().st_ino == ino
    ping_ok(data_dir, "field")


@pytest.mark.parametrize("agent_style", [True, False], ids=["renamed-in", "created-in-place"])
def test_fifo_is_quarantined_without_blocking(env: Env, agent_style: bool) -> None:
    rid = f"a0-fifo-{secrets.token_hex(4)}"  # sorts before the pings that follow
    if agent_style:
        _place_like_agent(_queue(env), f"{rid}.json", os.mkfifo)
    else:
        os.mkfifo(_queue(env) / f"{rid}.json")
    for _ in range(3):
        ping_ok(env.data_dir, "field")  # a blocked reader would never answer these
    note = wait_note(env.data_dir, "field", f"{rid}.json")
    assert note["reason"] == "request file is a FIFO; only regular files are read"
    _assert_error_result(env, "field", rid, note["reason"])
    assert quarantined_entry(env.data_dir, "field", "actions", f"{rid}.json").is_fifo()
    ping_ok(env.data_dir, "main")


def test_directory_named_like_a_request_is_quarantined(env: Env) -> None:
    rid = f"a0-dir-{secrets.token_hex(4)}"
    folder = _queue(env) / f"{rid}.json"
    folder.mkdir()
    (folder / "inner.json").write_text('{"type": "ping"}')
    ping_ok(env.data_dir, "field")
    note = wait_note(env.data_dir, "field", f"{rid}.json")
    assert note["reason"] == "request file is a directory; only regular files are read"
    entry = quarantined_entry(env.data_dir, "field", "actions", f"{rid}.json")
    assert entry.is_dir() and (entry / "inner.json").read_text() == '{"type": "ping"}'
    assert not folder.exists()
    _assert_error_result(env, "field", rid, note["reason"])
    ping_ok(env.data_dir, "field")


def test_huge_file_is_quarantined_unread_and_quickly(env: Env) -> None:
    rid = uid("huge")
    size = 50 * 1024 * 1024

    def make(path: Path) -> None:
        with open(path, "wb") as handle:
            handle.write(b'{"type": "ping", "pad": "')
            handle.truncate(size)

    assert env.daemon.proc is not None
    io = Path(f"/proc/{env.daemon.proc.pid}/io")

    def read_so_far() -> int:  # bytes the daemon (all its threads) has read, from the kernel's accounting
        return int(dict(line.split(": ") for line in io.read_text().splitlines())["rchar"])

    before = read_so_far()
    started = time.monotonic()
    _place_like_agent(_queue(env), f"{rid}.json", make)
    note = wait_note(env.data_dir, "field", f"{rid}.json")
    # Unread: the daemon read nowhere near the file's 50 MiB (a database page or a small request now and then).
    # And quickly: not a wait as long as reading and parsing 50 MiB on a loaded machine.
    assert read_so_far() - before < 4 * LIMIT, f"the daemon read {read_so_far() - before} bytes"
    assert time.monotonic() - started < scaled(10)
    refused = f"request file is {size} bytes, over the {LIMIT}-byte limit"
    # Kept as its first 64 KiB, not whole: what a group sends cannot fill the host's disk through its quarantine.
    assert quarantined_entry(env.data_dir, "field", "actions", f"{rid}.json").stat().st_size == KEEP_BYTES
    assert note["reason"] == f"{refused}; kept: the first {KEEP_BYTES} of {size} bytes"
    _assert_error_result(env, "field", rid, refused)
    ping_ok(env.data_dir, "field")


def _padded_ping(rid: str, size: int) -> bytes:
    body = json.dumps({"type": "ping", "requestId": rid}).encode()
    return body + b" " * (size - len(body))  # trailing whitespace is valid JSON


def test_size_limit_is_inclusive(env: Env) -> None:
    at_limit, over = uid("at-limit"), uid("over-limit")
    write_raw(_queue(env), f"{at_limit}.json", _padded_ping(at_limit, LIMIT))
    write_raw(_queue(env), f"{over}.json", _padded_ping(over, LIMIT + 1))
    assert wait_result(env.data_dir, "field", at_limit)["status"] == "success"
    note = wait_note(env.data_dir, "field", f"{over}.json")
    refused = f"request file is {LIMIT + 1} bytes, over the {LIMIT}-byte limit"
    assert note["reason"] == f"{refused}; kept: the first {KEEP_BYTES} of {LIMIT + 1} bytes"
    _assert_error_result(env, "field", over, refused)


# malformed and mistyped JSON ----------------------------------------------------------------------------------

SCHEDULE = {"type": "schedule_task", "prompt": "p", "schedule_type": "interval", "schedule_value": 60000}
REGISTER = {"type": "register_group", "jid": "telegram:-5", "name": "n", "folder": "f5"}
_ANY_VALUE = "Input should be a valid string, a valid integer or an object"
MALFORMED: dict[str, tuple[str, bytes | dict[str, Any], str]] = {
    # label: (queue, file content (a dict gets a requestId added and is dumped), reason substring)
    "truncated": ("actions", b'{"type": "ping", "requestId": "', "not valid JSON: Unterminated string"),
    "trailing-garbage": ("actions", b'{"type": "ping"} and more', "not valid JSON: Extra data at line 1 column 18"),
    "trailing-nul": ("actions", b'{"type": "ping"}\x00', "not valid JSON: Extra data"),
    "array": ("actions", b'[{"type": "ping"}]', "a request must be a JSON object, got list"),
    "string": ("actions", b'"ping"', "a request must be a JSON object, got str"),
    "number": ("actions", b"42", "a request must be a JSON object, got int"),
    "null": ("actions", b"null", "a request must be a JSON object"),
    "nested-100k": ("actions", b"[" * 100_000, "nested too deeply"),
    "nested-100k-closed": (
        "actions",
        b'{"type": "ping", "timestamp": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
    ),
    "not-utf8": ("actions", b'{"type": "ping", "x": "\xff\xfe"}', "file is not valid UTF-8 text"),
    "latin1": ("messages", '{"type": "message", "text": "café"}'.encode("latin-1"), "not valid UTF-8"),
    "empty": ("actions", b"", "not valid JSON: Expecting value at line 1 column 1"),
    "whitespace": ("actions", b"  \n ", "not valid JSON: Expecting value"),
    "bom": ("actions", b'\xef\xbb\xbf{"type": "ping"}', "BOM"),
    "huge-integer": ("actions", b'{"type": "ping", "ttl": ' + b"9" * 5000 + b"}", "not valid JSON"),
    "nan": ("actions", b'{"type": "ping", "ttl": NaN}', "field 'ttl'"),
    "ttl-as-string": ("actions", {"type": "ping", "ttl": "5"}, "field 'ttl': Input should be a valid number"),
    "ttl-negative": ("actions", {"type": "ping", "ttl": -1}, "field 'ttl'"),
    "prompt-as-int": ("tasks", {**SCHEDULE, "prompt": 5}, "field 'prompt': Input should be a valid string"),
    "bool-as-string": ("tasks", {**REGISTER, "requiresTrigger": "true"}, "field 'requiresTrigger'"),
    "taskid-as-int": ("tasks", {"type": "pause_task", "taskId": 5}, "field 'taskId'"),
    "text-as-list": ("messages", {"type": "message", "chatJid": "telegram:200", "text": ["hi"]}, "field 'text'"),
    "params-as-list": ("actions", {"type": "farm_action", "action": "ha_get_status", "params": []}, "field 'params'"),
    # An action's params of the wrong type or shape make the file malformed too (SPEC §4: "wrong types").
    "param-of-wrong-type": (
        "actions",
        {"type": "memory_action", "action": "memory_search", "params": {"query": "x", "topK": "8"}},
        "memory_search: param 'topK' must be a whole number (got '8')",
    ),
    "param-unknown": (
        "actions",
        {"type": "memory_action", "action": "memory_get", "params": {"path": "MEMORY.md", "offset": 3}},
        "memory_get: unknown param 'offset'",
    ),
    "farm-param-of-wrong-type": (
        "actions",
        {"type": "farm_action", "action": "ha_call_service", "params": {"domain": 5, "service": "turn_on"}},
        "ha_call_service: param 'domain' must be text (got 5)",
    ),
    "bad-expiresAt": ("actions", {"type": "ping", "expiresAt": "tomorrow"}, "field 'expiresAt'"),
    "naive-expiresAt": ("actions", {"type": "ping", "expiresAt": "2030-01-01T00:00:00"}, "field 'expiresAt'"),
    "unknown-type": ("actions", {"type": "launch_missiles"}, "unknown type 'launch_missiles' for the actions queue"),
    "type-of-other-queue": (
        "actions",
        {"type": "message", "chatJid": "telegram:200", "text": "hi"},
        "unknown type 'message' for the actions queue (expected one of: farm_action, ping, memory_action)",
    ),
    "ping-in-tasks": ("tasks", {"type": "ping"}, "unknown type 'ping' for the tasks queue"),
    "type-missing": ("actions", {"requestIdx": 1}, "unknown type None for the actions queue"),
    "type-not-string": ("actions", {"type": ["ping"]}, "unknown type ['ping']"),
    "unknown-action": ("actions", {"type": "farm_action", "action": "rm_rf", "params": {}}, "field 'action'"),
    "unknown-field": ("actions", {"type": "ping", "bogus": 1}, "unknown field 'bogus'"),
    "isMain-on-ping": ("actions", {"type": "ping", "isMain": True}, "unknown field 'isMain'"),
    "missing-field": ("messages", {"type": "message", "text": "hi"}, "missing field 'chatJid'"),
    "missing-prompt": ("tasks", {**SCHEDULE, "prompt": None}, "field 'prompt'"),
    "bad-schedule-type": ("tasks", {**SCHEDULE, "schedule_type": "hourly"}, "field 'schedule_type'"),
    "bad-group-folder": ("tasks", {**SCHEDULE, "groupFolder": "../main"}, "field 'groupFolder'"),
    # A field that takes several types names them all, in the agent's own field names (no pydantic internals).
    "interval-as-float": ("tasks", {**SCHEDULE, "schedule_value": 1.5}, f"field 'schedule_value': {_ANY_VALUE}"),
    "interval-as-bool": ("tasks", {**SCHEDULE, "schedule_value": True}, f"field 'schedule_value': {_ANY_VALUE}"),
    "schedule-as-list": ("tasks", {**SCHEDULE, "schedule_value": [60000]}, f"field 'schedule_value': {_ANY_VALUE}"),
    "timestamp-as-list": (
        "actions",
        {"type": "ping", "timestamp": [1]},
        "field 'timestamp': Input should be a valid string or a valid number",
    ),
}
# pydantic's names for the validators and union branches of a field, which mean nothing to an agent.
_INTERNALS = re.compile(r"function-(after|before|wrap|plain)|constrained-|tagged-union|'[^']*\.(str|int|float|dict)'")


@pytest.mark.parametrize(("queue", "content", "reason"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_request_is_quarantined_with_a_specific_reason(
    env: Env, queue: str, content: bytes | dict[str, Any], reason: str
) -> None:
    stem = uid("bad")
    if isinstance(content, dict):
        # The id comes from the JSON, and it is not the file's stem: the answer must use the JSON's.
        rid = uid("json-id")
        raw = json.dumps({**content, "requestId": rid}).encode()
    else:
        rid, raw = stem, content
    name = f"{stem}.json"
    write_raw(_queue(env, queue=queue), name, raw)

    note = wait_note(env.data_dir, "field", name, queue=queue)
    assert reason in note["reason"], note
    assert not _INTERNALS.search(note["reason"]), note
    assert note["errorCode"] == "invalid_request" and note["queue"] == queue
    assert quarantined_entry(env.data_dir, "field", queue, name).read_bytes() == raw[:KEEP_BYTES]
    # What was kept is said in the reason, unless the file was kept whole; the agent gets the reason itself.
    kept = "" if len(raw) <= KEEP_BYTES else f"; kept: the first {KEEP_BYTES} of {len(raw)} bytes"
    assert note["reason"].endswith(kept) and ("; kept: " in note["reason"]) == bool(kept), note
    result = _assert_error_result(env, "field", rid, note["reason"].removesuffix(kept))
    named = content.get("action") if isinstance(content, dict) else None
    assert result["action"] == (named if named in ACTION_PARAMS else None)  # a known action is named, no other
    if rid != stem:
        assert read_result(env.data_dir, "field", stem) is None
    _assert_logged_quarantine(env, "field", queue, name, note["reason"])
    [record] = wait_logged(env.data_dir, file=name)
    assert record["status"] == "quarantined" and record["answered"] is True and record["requestId"] == rid
    assert not (_queue(env, queue=queue) / name).exists()
    ping_ok(env.data_dir, "field")


ODD_NAMES = {
    # a name that is not UTF-8 must still get a readable note
    "not-utf8": (os.fsdecode(b"\xff\xfe-odd.json"), "\ufffd\ufffd-odd.json"),
    # 245 bytes itself: with the quarantine's stamp and queue in front it would pass NAME_MAX (255 bytes)
    "long-multibyte": ("é" * 120 + ".json", "é" * 120 + ".json"),
    "long-ascii": ("n" * 250 + ".json", "n" * 250 + ".json"),
}


@pytest.mark.parametrize(("name", "printable"), list(ODD_NAMES.values()), ids=list(ODD_NAMES))
def test_odd_file_names_are_quarantined_without_blocking_the_queue(env: Env, name: str, printable: str) -> None:
    write_raw(_queue(env), name, b"{garbage")
    entry, note = wait_quarantined(env.data_dir, "field", printable)
    assert note["reason"].startswith("not valid JSON")
    assert len(os.fsencode(entry.name)) <= 200 and entry.read_bytes() == b"{garbage"
    assert not (_queue(env) / name).exists()
    assert not os.listdir(env.data_dir / "ipc" / ".spool" / "field" / "actions")
    ping_ok(env.data_dir, "field")


def test_directory_planted_where_the_result_goes_does_not_block_the_queue(env: Env) -> None:
    rid, after = uid("planted-dir"), uid("zz-after")  # the second sorts after the first: it must not be blocked
    planted = env.data_dir / "ipc" / "field" / "action_results" / f"{rid}.json"
    planted.mkdir()
    (planted / "keep.txt").write_text("agent's own")
    for request_id in (rid, after):
        write_raw(_queue(env), f"{request_id}.json", json.dumps({"type": "ping", "requestId": request_id}).encode())
    assert wait_result(env.data_dir, "field", after)["status"] == "success"
    # Reads of one listing are answered side by side, and evicting the directory takes a thread: either may be first.
    assert wait_result(env.data_dir, "field", rid)["status"] == "success" and planted.is_file()
    note = wait_note(env.data_dir, "field", f"{rid}.json", queue="action_results")
    assert "a directory stood at action_results/" in note["reason"]
    moved = quarantined_entry(env.data_dir, "field", "action_results", f"{rid}.json")
    assert (moved / "keep.txt").read_text() == "agent's own"


# flood (last: it leaves 10,000 results behind) --------------------------------------------------------------------


def test_flood_of_ten_thousand_pings_is_answered(env: Env) -> None:
    queue_dir = _queue(env)
    results = env.data_dir / "ipc" / "field" / "action_results"
    count = 10_000
    for i in range(count):
        tmp = queue_dir / f".flood-{i}.tmp"
        tmp.write_bytes(b'{"type": "ping"}')
        os.rename(tmp, queue_dir / f"flood-{i:05d}.json")

    def answered() -> int:
        return sum(1 for name in os.listdir(results) if name.startswith("flood-"))

    wait_for(lambda: answered() == count, timeout=50, interval=0.25, what=f"{count} flood results")
    assert not [n for n in os.listdir(queue_dir) if n.startswith("flood-")]
    for i in (0, 4_999, 9_999):
        assert json.loads((results / f"flood-{i:05d}.json").read_bytes())["status"] == "success"
    ping_ok(env.data_dir, "field")
    ping_ok(env.data_dir, "main")
