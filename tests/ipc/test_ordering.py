"""Engine guarantees against the real daemon: at-most-once per requestId, expiry, stale files, file-name order."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, drop, read_result, result_path, wait_for, wait_result
from ipc_support import Env, logged, outbox, ping_ok, tasks, uid, wait_logged, wait_note, write_raw


def _schedule(rid: str, marker: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "schedule_task",
        "requestId": rid,
        "prompt": f"check the pumps {marker}",
        "schedule_type": "interval",
        "schedule_value": 3_600_000,
        **extra,
    }


def _tasks_with(data_dir: Path, marker: str) -> list[dict[str, Any]]:
    return [t for t in tasks(data_dir) if marker in t["prompt"]]


# duplicates ------------------------------------------------------------------------------------------------------


def test_same_request_id_twice_is_executed_once(env: Env) -> None:
    data_dir, rid, marker = env.data_dir, uid("dup"), uid("marker")
    drop(data_dir, "field", "tasks", _schedule(rid, marker))
    first = wait_result(data_dir, "field", rid)
    assert first["status"] == "success"
    stored = result_path(data_dir, "field", rid).read_bytes()

    # The same id again, under another file name and with another prompt: the stored answer, nothing run.
    drop(data_dir, "field", "tasks", _schedule(rid, marker + "-again"), name=f"{uid('second')}.json")
    first_run, replay = wait_logged(data_dir, requestId=rid, count=2)
    assert first_run["replayed"] is False and replay["replayed"] is True
    assert result_path(data_dir, "field", rid).read_bytes() == stored
    assert [t["id"] for t in _tasks_with(data_dir, marker)] == [first["result"]["taskId"]]
    assert not _tasks_with(data_dir, marker + "-again")

    # The same id from another queue of the group is the same request too.
    drop(data_dir, "field", "actions", {"type": "ping", "requestId": rid}, name=f"{uid('third')}.json")
    wait_logged(data_dir, requestId=rid, count=3)
    assert result_path(data_dir, "field", rid).read_bytes() == stored


def test_request_ids_are_per_group(env: Env) -> None:
    rid = uid("shared-id")
    for folder in ("main", "field"):
        drop(env.data_dir, folder, "actions", {"type": "ping", "requestId": rid})
    for folder in ("main", "field"):
        assert wait_result(env.data_dir, folder, rid)["status"] == "success"
    assert {r["group"] for r in wait_logged(env.data_dir, requestId=rid, count=2)} == {"main", "field"}
    assert not [r for r in logged(env.data_dir, requestId=rid) if r["replayed"]]


def test_bad_file_reusing_an_earlier_id_does_not_overwrite_its_result(env: Env) -> None:
    data_dir, rid = env.data_dir, uid("kept")
    drop(data_dir, "field", "actions", {"type": "ping", "requestId": rid})
    assert wait_result(data_dir, "field", rid)["status"] == "success"
    stored = result_path(data_dir, "field", rid).read_bytes()
    queue = data_dir / "ipc" / "field" / "actions"

    attempts = [
        (f"{uid('reuse')}.json", json.dumps({"type": "ping", "requestId": rid, "bogus": True}).encode()),
        (f"{uid('reuse')}.json", json.dumps({"type": "launch", "requestId": rid}).encode()),
        (f"{rid}.json", b"{not json"),  # the id is recovered from the stem
    ]
    for name, raw in attempts:
        write_raw(queue, name, raw)
        note = wait_note(data_dir, "field", name)
        assert note["errorCode"] == "invalid_request"
        [record] = wait_logged(data_dir, file=name, status="quarantined")
        # Answered with the stored result again (SPEC: the same id gets the earlier answer back), not the refusal.
        assert record["requestId"] == rid and record["answered"] is True
        assert json.loads(result_path(data_dir, "field", rid).read_bytes()) == json.loads(stored)
    # Refused unread (a symlink named after the id): the stored result stays too.
    tmp = queue / ".link.tmp"
    os.symlink("/etc/hostname", tmp)
    os.rename(tmp, queue / f"{rid}.json")
    wait_note(data_dir, "field", f"{rid}.json", reason="request file is a symlink")
    ping_ok(data_dir, "field")
    assert json.loads(result_path(data_dir, "field", rid).read_bytes()) == json.loads(stored)


# expiry ---------------------------------------------------------------------------------------------------------


def test_expired_requests_are_answered_and_not_executed(env: Env) -> None:
    data_dir, marker = env.data_dir, uid("expiring")
    cases = {
        uid("ttl"): ("tasks", _schedule("", marker, ttl=1e-6)),
        uid("past"): ("tasks", _schedule("", marker, expiresAt="2020-01-01T00:00:00Z")),
        uid("past-offset"): ("tasks", _schedule("", marker, expiresAt="2021-06-01T12:00:00+02:00")),
        uid("msg"): ("messages", {"type": "message", "chatJid": "telegram:200", "text": "x", "ttl": 1e-6}),
        # a control action from main: expiry is checked before anything else
        uid("farm"): ("actions", {"type": "farm_action", "action": "ha_restart", "expiresAt": "2020-01-01T00:00:00Z"}),
    }
    for rid, (queue, payload) in cases.items():
        drop(data_dir, "field" if queue != "actions" else "main", queue, {**payload, "requestId": rid})
    for rid, (queue, _) in cases.items():
        folder = "field" if queue != "actions" else "main"
        result = wait_result(data_dir, folder, rid)
        assert result["status"] == "error" and result["errorCode"] == "expired", result
        assert "expired" in result["error"] and "nothing was done" in result["error"]
    control = uid("future")
    drop(data_dir, "field", "tasks", _schedule(control, marker, expiresAt="2999-01-01T00:00:00Z", ttl=600))
    assert wait_result(data_dir, "field", control)["status"] == "success"
    assert len(_tasks_with(data_dir, marker)) == 1, "only the unexpired schedule_task may create a task"
    assert not [e for e in outbox(data_dir) if e["messageKey"].endswith(tuple(cases))]


def test_files_older_than_an_hour_at_start_are_expired(data_dir: Path) -> None:
    two_hours_ago = time.time() - 7200
    half_an_hour_ago = time.time() - 1800
    stale = {
        "stale-task": ("tasks", _schedule("stale-task", "stale")),
        "stale-ping": ("actions", {"type": "ping", "requestId": "stale-ping"}),
        "stale-msg": ("messages", {"type": "message", "chatJid": "telegram:200", "text": "old news"}),
    }
    for rid, (queue, payload) in stale.items():
        drop(data_dir, "field", queue, payload, name=f"{rid}.json")
        os.utime(data_dir / "ipc" / "field" / queue / f"{rid}.json", (two_hours_ago, two_hours_ago))
    drop(data_dir, "field", "actions", b"{broken", name="stale-broken.json")
    os.utime(data_dir / "ipc" / "field" / "actions" / "stale-broken.json", (two_hours_ago, two_hours_ago))
    drop(data_dir, "field", "tasks", _schedule("recent-task", "recent"), name="recent-task.json")
    os.utime(data_dir / "ipc" / "field" / "tasks" / "recent-task.json", (half_an_hour_ago, half_an_hour_ago))

    daemon = Daemon(data_dir).start()
    try:
        for rid in stale:
            result = wait_result(data_dir, "field", rid)
            assert result["errorCode"] == "expired", result
            assert "waited too long before the host started" in result["error"]
        assert wait_result(data_dir, "field", "recent-task")["status"] == "success"
        assert "not valid JSON" in wait_note(data_dir, "field", "stale-broken.json")["reason"]
        assert wait_result(data_dir, "field", "stale-broken")["errorCode"] == "invalid_request"
        ping_ok(data_dir, "field")
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log()
    assert [t["prompt"] for t in tasks(data_dir)] == ["check the pumps recent"]
    assert outbox(data_dir) == []


# order ----------------------------------------------------------------------------------------------------------


def test_queue_is_processed_in_file_name_order(data_dir: Path) -> None:
    queue = data_dir / "ipc" / "field" / "tasks"
    names = [f"t-{i:03d}" for i in range(50)]
    shuffled = names[:]
    random.Random(7).shuffle(shuffled)
    now = time.time()
    for age, name in enumerate(shuffled):
        drop(data_dir, "field", "tasks", _schedule(name, "ordered", taskId=f"task-{name}"), name=f"{name}.json")
        os.utime(queue / f"{name}.json", (now - 600 + age, now - 600 + age))  # mtime order != name order

    daemon = Daemon(data_dir).start()
    try:
        results = [wait_result(data_dir, "field", name) for name in names]
        assert all(r["status"] == "success" for r in results)
        processed = [r["requestId"] for r in wait_logged(data_dir, group="field", queue="tasks", count=50)]
        assert processed == names
        executed = [r["executedAt"] for r in results]
        assert executed == sorted(executed)
        ping_ok(data_dir, "field")
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log()
    listed = {t["id"]: t for t in tasks(data_dir)}
    assert sorted(listed) == [f"task-{name}" for name in names]


def test_spool_leftovers_go_first_and_nothing_is_lost_across_restart(data_dir: Path) -> None:
    """Requests the daemon claimed but had not answered when it was killed are answered on restart, first."""
    daemon = Daemon(data_dir).start()
    queue = data_dir / "ipc" / "field" / "actions"
    spool = data_dir / "ipc" / ".spool" / "field" / "actions"
    daemon.kill()
    # As if the host died between claiming and answering: a request in the spool, another still queued.
    write_raw(spool, "b-claimed.json", b'{"type": "ping"}')
    write_raw(queue, "a-queued.json", b'{"type": "ping"}')
    daemon = Daemon(data_dir).start()
    try:
        wait_for(lambda: read_result(data_dir, "field", "a-queued") and read_result(data_dir, "field", "b-claimed"))
        assert [r["requestId"] for r in wait_logged(data_dir, group="field", count=2)] == ["b-claimed", "a-queued"]
        assert os.listdir(spool) == [] and os.listdir(queue) == []
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log()
