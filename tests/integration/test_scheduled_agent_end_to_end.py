"""Issue 5's done-means, end to end with every part real.

An agent schedules a task by writing into its `tasks/` queue (farmagent's IPC client); the daemon's
scheduler fires it on time and runs an agent in bubblewrap; the agent's LLM (a scripted chat-completions
server, reached only through the host's proxy socket) calls `memory_search`, then `send_message` with what
it found; the message lands in the outbox and the run is recorded.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmagent.ipc.client import IpcClient
from farmhost_testing import (
    FIELD_JID,
    clean_env,
    farmhost,
    init_data_dir,
    once_time,
    running_daemon,
    scaled,
    wait_for,
)
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall

from farmhost.store import outbox
from farmhost.store.db import Database

pytestmark = pytest.mark.slow  # end to end, many seconds each (make test-fast leaves it out)

FARM_ZONE = "Europe/Lisbon"
API_KEY = "sk-farm-e2e-secret"
VALVE_NOTE = "The north valve leaks above 3 bar: close it by hand before irrigating field 2."


def _send_what_memory_said(request: Recorded) -> ToolCall:
    found = json.loads(request.last_tool_result() or "{}")
    snippet = found["hits"][0]["snippet"]
    return ToolCall("send_message", {"chatJid": FIELD_JID, "text": f"Reminder from the farm notes: {snippet}"})


def _outbox_texts(data_dir: Path) -> list[str]:
    db = Database.open(data_dir)
    try:
        return [e.body or "" for e in outbox.list_entries(db.conn) if e.chat_jid == FIELD_JID]
    finally:
        db.close()


def _task_runs(data_dir: Path, task_id: str) -> list[dict[str, Any]]:
    done = farmhost("task", "runs", task_id, "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    runs: list[dict[str, Any]] = json.loads(done.stdout)
    return runs


def test_a_task_scheduled_by_an_agent_runs_a_bwrap_agent_that_searches_memory_and_messages_the_chat(
    tmp_path: Path, llm_stub: ScriptedLLM
) -> None:
    data_dir = init_data_dir(tmp_path / "data")
    memory = data_dir / "groups" / "field" / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    (memory / "valves.md").write_text(f"# Valves\n\n{VALVE_NOTE}\n", encoding="utf-8")
    llm_stub.script(
        ToolCall("memory_search", {"query": "north valve"}),
        _send_what_memory_said,
        Reply("I reminded the crew about the north valve."),
    )
    env = clean_env(
        TZ=FARM_ZONE,
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY=API_KEY,
        FARMHOST_AGENT_TIMEOUT_SECONDS="60",
    )
    with running_daemon(data_dir, env=env) as daemon:
        due = once_time(data_dir, "field", ZoneInfo(FARM_ZONE))
        agent = IpcClient(data_dir / "ipc" / "field")
        scheduled = agent.schedule_task(
            "Remind the crew what our notes say about the north valve.", "once", due.strftime("%Y-%m-%dT%H:%M:%S")
        )
        task_id = scheduled["taskId"]
        assert datetime.fromisoformat(scheduled["nextRun"]) == due

        texts = wait_for(lambda: _outbox_texts(data_dir), timeout=45, interval=0.2, what="the agent's message")
        runs = wait_for(
            lambda: [r for r in _task_runs(data_dir, task_id) if r["status"] != "running"],
            timeout=20,
            interval=0.3,
            what=f"the run of task {task_id} to end",
            seen=lambda: _task_runs(data_dir, task_id),
        )
        assert "Traceback" not in daemon.log()

    (text,) = texts
    assert text.startswith("Reminder from the farm notes:") and VALVE_NOTE in text
    (run,) = runs
    assert run["status"] == "ok", run
    assert "reminded the crew" in run["summary"]
    assert datetime.fromisoformat(run["dueAt"]) == due.astimezone(UTC)
    started = datetime.fromisoformat(run["claimedAt"])
    assert timedelta(0) <= started - due  # not early
    # and on time, as far as this machine allows (a scheduler that looked only now and then would be far later)
    assert started - due < timedelta(seconds=scaled(5))

    first, second, third = llm_stub.requests
    assert first.headers["authorization"] == f"Bearer {API_KEY}"  # added by the host's proxy
    assert first.model == "farm-model"
    assert "north valve" in first.text() and "scheduled" in first.system.lower()
    assert VALVE_NOTE in (second.last_tool_result() or "")  # the real memory_search answer
    assert "queued" in (third.last_tool_result() or "")  # the real send_message answer

    done = farmhost("task", "list", "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    (task,) = [t for t in json.loads(done.stdout) if t["id"] == task_id]
    assert task["status"] == "completed"
