"""Crash safety: kill -9 the real daemon under load, restart it, and check no request is lost or run twice."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    FIELD_JID,
    MAIN_JID,
    Daemon,
    clean_env,
    drop,
    quarantined,
    read_result,
    scaled,
    wait_for,
    wait_result,
)

JIDS = {"main": MAIN_JID, "field": FIELD_JID}
QUEUES = ("messages", "tasks", "actions")
KILLS = 20
# ~80 requests/s: enough that most kills land mid-request, little enough that the final drain takes a second or two.
WRITER_PAUSE = 0.012


@dataclass(frozen=True)
class Sent:
    folder: str
    queue: str
    kind: str  # ping | schedule | message | control
    rid: str


def _payload(kind: str, folder: str, rid: str) -> tuple[str, dict[str, Any]]:
    if kind == "ping":
        return "actions", {"type": "ping", "requestId": rid}
    if kind == "schedule":
        return "tasks", {
            "type": "schedule_task",
            "requestId": rid,
            "taskId": rid,
            "prompt": f"check the pumps ({rid})",
            "schedule_type": "interval",
            "schedule_value": "3600000",
        }
    if kind == "message":
        return "messages", {"type": "message", "requestId": rid, "chatJid": JIDS[folder], "text": f"hello {rid}"}
    return "actions", {
        "type": "farm_action",
        "requestId": rid,
        "action": "ha_call_service",
        "params": {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.pump_1"}},
    }


def write_until(halt: threading.Event, data_dir: Path, seed: int) -> list[Sent]:
    """An agent in each group that keeps dropping requests, whether the host is up or not; returns what it sent."""
    rng = random.Random(seed)
    sent: list[Sent] = []
    n = 0
    while not halt.is_set():
        folder = ("main", "field")[n % 2]
        kinds = ["ping", "schedule", "message"] + (["control", "control"] if folder == "main" else [])
        kind = rng.choice(kinds)
        rid = f"{kind}-{folder}-{n:05d}"
        queue, payload = _payload(kind, folder, rid)
        drop(data_dir, folder, queue, payload)
        sent.append(Sent(folder, queue, kind, rid))
        n += 1
        time.sleep(WRITER_PAUSE)
    return sent


def _leftovers(data_dir: Path) -> list[str]:
    """Request files still waiting in a queue or in the host's spool."""
    found = []
    for folder in ("main", "field"):
        for queue in QUEUES:
            for where in (data_dir / "ipc" / folder / queue, data_dir / "ipc" / ".spool" / folder / queue):
                if where.is_dir():
                    found += [str(p) for p in where.iterdir() if p.name.endswith(".json")]
    return found


def _result_names(data_dir: Path, folder: str) -> list[str]:
    results = data_dir / "ipc" / folder / "action_results"
    return [p.name for p in results.iterdir() if not p.name.startswith(".")]


def _db(data_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)


@pytest.mark.slow
@pytest.mark.timeout(240)  # 20 daemon starts and the drain after them; stretched further on a busy machine
def test_kill9_under_load_loses_nothing_and_runs_nothing_twice(data_dir: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    # Hundreds of tasks per group: far more than the per-group limit, which is not what this test is about.
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_TASKS_PER_GROUP="10000"))
    halt = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        writer = pool.submit(write_until, halt, data_dir, seed)
        try:
            for _ in range(KILLS):
                if rng.random() < 0.25:  # sometimes while it is still starting up and recovering its spool
                    daemon.start(wait_group=None)
                    time.sleep(rng.uniform(0.2, 0.7))
                else:
                    daemon.start()
                    time.sleep(rng.uniform(0.02, 0.9))
                daemon.kill()
        except BaseException:
            if daemon.proc is not None:
                daemon.kill()
            raise
        finally:
            halt.set()
        sent = writer.result(timeout=scaled(5))
    assert len(sent) > 500, f"the writer only managed {len(sent)} requests"

    def unanswered() -> list[str]:
        answered = {(f, name) for f in ("main", "field") for name in _result_names(data_dir, f)}
        return [s.rid for s in sent if (s.folder, f"{s.rid}.json") not in answered]

    daemon.start()
    try:
        # The backlog of 20 dead spells drains at whatever pace the machine allows: wait while results keep
        # coming, and fail only when none has come for a while (or after ten such spells in all).
        wait_for(
            lambda: not unanswered(),
            timeout=20,
            interval=0.05,
            what=f"every result (seed {seed}, {len(sent)} requests)",
            progress=lambda: len(unanswered()),
            seen=lambda: (
                f"{len(unanswered())} unanswered, e.g. {unanswered()[:5]}; leftovers {_leftovers(data_dir)[:5]}"
            ),
        )
        wait_for(
            lambda: not _leftovers(data_dir),
            timeout=10,
            what="queues and spool to empty",
            seen=lambda: _leftovers(data_dir)[:10],
        )
        _check_results(data_dir, sent, seed)
        _check_store(data_dir, sent, seed)
    finally:
        code = daemon.stop()
    assert code == 0
    log = daemon.log()
    assert "Traceback" not in log, log[-4000:]


def _check_results(data_dir: Path, sent: list[Sent], seed: int) -> None:
    for folder in ("main", "field"):
        expected = {f"{s.rid}.json" for s in sent if s.folder == folder}
        assert sorted(_result_names(data_dir, folder)) == sorted(expected), f"seed {seed}"
        # Every note file, not `quarantined` (which leaves out one it cannot parse yet): a crash may cut one short.
        notes = list((data_dir / "ipc" / "errors" / folder).glob("*.reason.json"))
        assert notes == [], f"seed {seed}: {quarantined(data_dir, folder)}"
    interrupted = []
    for item in sent:
        result = read_result(data_dir, item.folder, item.rid)
        assert result is not None
        assert result["requestId"] == item.rid
        outcome = (result["status"], result["errorCode"])
        if item.kind == "control":
            assert result["action"] == "ha_call_service"
            assert outcome in {("error", "upstream_unavailable"), ("error", "interrupted")}, (seed, result)
            if result["errorCode"] == "interrupted":
                interrupted.append(item.rid)
        else:
            # A schedule_task run twice would say `conflict`, a message run twice `internal`; never `interrupted`.
            assert outcome == ("success", None), (seed, item, result)
    # Only the one control action in flight when the host died can be interrupted, at most one per kill.
    assert len(interrupted) <= KILLS, (seed, interrupted)


def _check_store(data_dir: Path, sent: list[Sent], seed: int) -> None:
    with closing(_db(data_dir)) as conn:
        tasks = conn.execute("SELECT id, group_folder FROM tasks").fetchall()
        assert len(tasks) == len({t[0] for t in tasks})
        assert sorted(tasks) == sorted((s.rid, s.folder) for s in sent if s.kind == "schedule"), f"seed {seed}"

        chunks = Counter(conn.execute("SELECT message_key, chunk_index FROM outbox").fetchall())
        assert [key for key, n in chunks.items() if n != 1] == []
        keys = {key for key, _ in chunks}
        assert keys == {f"ipc:{s.folder}:{s.rid}" for s in sent if s.kind == "message"}, f"seed {seed}"

        ledger = conn.execute("SELECT folder, request_id, state, result FROM request_ledger").fetchall()
    assert {(folder, rid) for folder, rid, _, _ in ledger} == {(s.folder, s.rid) for s in sent}
    assert {state for _, _, state, _ in ledger} == {"done"}
    for folder, rid, _, stored in ledger:  # what the agent holds is what the ledger holds
        assert json.loads(stored) == read_result(data_dir, folder, rid)


# The deterministic version: the state a daemon leaves behind when it dies at each point of a request.


def _spool(data_dir: Path, folder: str, queue: str, name: str, payload: dict[str, Any]) -> None:
    where = data_dir / "ipc" / ".spool" / folder / queue
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_text(json.dumps(payload))


def _ledger_row(data_dir: Path, folder: str, rid: str, queue: str, kind: str, action: str | None, **extra: Any) -> None:
    conn = sqlite3.connect(data_dir / "farmhost.db")
    try:
        with conn:
            conn.execute(
                "INSERT INTO request_ledger (folder, request_id, queue, kind, action, state, result, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    folder,
                    rid,
                    queue,
                    kind,
                    action,
                    extra.get("state", "started"),
                    json.dumps(extra["result"]) if "result" in extra else None,
                    datetime.now(UTC).isoformat(timespec="milliseconds"),  # recent: older entries are pruned
                ),
            )
    finally:
        conn.close()


def test_restart_answers_what_the_dead_host_left_in_its_spool(data_dir: Path) -> None:
    turn_on = {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.irrigation_pump"}}
    control = {"type": "farm_action", "action": "ha_call_service", "params": turn_on}
    # Died mid-EXTERNAL: claimed, marked started, never finished.
    _spool(data_dir, "main", "actions", "ctl-died.json", {**control, "requestId": "ctl-died"})
    _ledger_row(data_dir, "main", "ctl-died", "actions", "farm_action", "ha_call_service")
    # Died after claiming an EXTERNAL, before marking it started: it never ran, so it runs now.
    _spool(data_dir, "main", "actions", "ctl-unstarted.json", {**control, "requestId": "ctl-unstarted"})
    # Died mid-READ: no ledger row; it is simply run again.
    _spool(data_dir, "field", "actions", "read-died.json", {"type": "ping", "requestId": "read-died"})
    # Died after a STATE commit, before the result was written: the stored result comes back, nothing re-runs.
    stored = {
        "requestId": "st-done",
        "type": "schedule_task",
        "action": None,
        "status": "success",
        "result": {"taskId": "st-done", "nextRun": "2026-01-01T01:00:00.000+00:00"},
        "error": None,
        "errorCode": None,
        "executedAt": "2026-01-01T00:00:00.000Z",
        "durationMs": 3,
    }
    schedule = {"type": "schedule_task", "prompt": "p", "schedule_type": "interval", "schedule_value": "3600000"}
    _spool(data_dir, "field", "tasks", "st-done.json", {**schedule, "requestId": "st-done", "taskId": "st-done"})
    _ledger_row(data_dir, "field", "st-done", "tasks", "schedule_task", None, state="done", result=stored)
    # Died before a STATE commit: it runs now, once.
    message = {"type": "message", "chatJid": "telegram:200", "text": "pump 2 is on"}
    _spool(data_dir, "field", "messages", "msg-died.json", {**message, "requestId": "msg-died"})

    daemon = Daemon(data_dir).start()
    try:
        died = wait_result(data_dir, "main", "ctl-died")
        assert (died["status"], died["errorCode"], died["action"]) == ("error", "interrupted", "ha_call_service")
        assert "not repeated" in died["error"]
        unstarted = wait_result(data_dir, "main", "ctl-unstarted")
        assert unstarted["errorCode"] == "upstream_unavailable"
        read = wait_result(data_dir, "field", "read-died")
        assert read["status"] == "success" and read["result"]["pong"] is True
        assert wait_result(data_dir, "field", "st-done") == stored
        sent = wait_result(data_dir, "field", "msg-died")
        assert sent["status"] == "success" and sent["result"]["chunks"] == 1
        wait_for(lambda: not _leftovers(data_dir), what="the spool to empty")
        with closing(_db(data_dir)) as conn:
            assert conn.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
            keys = conn.execute("SELECT message_key FROM outbox").fetchall()
            states = dict(conn.execute("SELECT request_id, state FROM request_ledger").fetchall())
        assert keys == [("ipc:field:msg-died",)]
        assert states == dict.fromkeys(["ctl-died", "ctl-unstarted", "read-died", "st-done", "msg-died"], "done")
    finally:
        assert daemon.stop() == 0
    # Once answered, the interrupted request stays answered: a second file with its id gets the same result.
    result_path = data_dir / "ipc" / "main" / "action_results" / "ctl-died.json"
    result_path.unlink()
    drop(data_dir, "main", "actions", {**control, "requestId": "ctl-died"})
    daemon.start()
    try:
        assert wait_result(data_dir, "main", "ctl-died") == died
    finally:
        assert daemon.stop() == 0


def _collect_until(halt: threading.Event, data_dir: Path, collected: Counter[str]) -> None:
    """The agent's client: reads each result as it appears and deletes it, as farmagent does."""
    results = data_dir / "ipc" / "main" / "action_results"
    while True:
        stopping = halt.is_set()
        for path in results.glob("*.json"):
            if path.name.startswith("."):
                continue
            try:
                document = json.loads(path.read_bytes())
                path.unlink()
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            collected[document["requestId"]] += 1
        if stopping:
            return
        time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill9_never_brings_back_a_result_the_agent_collected(data_dir: Path) -> None:
    """A kill -9 between a durable result and the release of its spooled file: the restart writes no second copy.

    The agent read and deleted that result; a second copy would be read as a new answer.
    """
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    # Hundreds of tasks per group: far more than the per-group limit, which is not what this test is about.
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_TASKS_PER_GROUP="10000"))
    halt, stop_collecting = threading.Event(), threading.Event()
    collected: Counter[str] = Counter()
    sent: list[str] = []

    def write() -> None:
        n = 0
        while not halt.is_set():
            rid = f"ping-{n:05d}"
            drop(data_dir, "main", "actions", {"type": "ping", "requestId": rid})
            sent.append(rid)
            n += 1
            time.sleep(0.002)

    with ThreadPoolExecutor(2) as pool:
        writer = pool.submit(write)
        collector = pool.submit(_collect_until, stop_collecting, data_dir, collected)
        try:
            for _ in range(KILLS // 2):
                daemon.start()
                time.sleep(rng.uniform(0.05, 0.6))
                daemon.kill()
        finally:
            halt.set()
            writer.result(timeout=scaled(5))
        daemon.start()
        try:
            wait_for(
                lambda: set(collected) >= set(sent) and not _leftovers(data_dir),
                timeout=20,
                what=f"every result collected and the spool empty (seed {seed}, {len(sent)} pings)",
                progress=lambda: len(collected),
                seen=lambda: f"{len(set(sent) - set(collected))} not collected; leftovers {_leftovers(data_dir)[:5]}",
            )
        finally:
            stop_collecting.set()
            collector.result(timeout=scaled(5))
            code = daemon.stop()
    assert code == 0
    again = sorted(rid for rid, times in collected.items() if times > 1)
    assert again == [], f"seed {seed}: {len(again)} of {len(sent)} results came back after they were collected"
    assert _result_names(data_dir, "main") == []
