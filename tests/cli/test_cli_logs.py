"""`farmhost run --log-format json -v`: one JSON object per line, the main events carry their ids, no secret leaks.

One real daemon with a fake Bot API and a scripted LLM: an IPC request, the first index of a 500-file memory, a
scheduled task that runs an agent, a delivered message and one Telegram refuses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import (
    FIELD_JID,
    MAIN_JID,
    Daemon,
    clean_env,
    drop,
    farmhost,
    once_time,
    wait_for,
    wait_result,
)
from llm_stub import Reply, ScriptedLLM
from telegram_stub import FakeTelegram

from farmhost.logs import configure

BOT_TOKEN = "987654:AAH-farm-logs-secret-0123456789abcdef"
LLM_KEY = "sk-logs-secret-key-0123456789"
ZONE = "Europe/Lisbon"
FIELD_CHAT = int(FIELD_JID.split(":")[1])


@pytest.fixture
def telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=BOT_TOKEN, unknown_chats=[FIELD_CHAT]) as fake:  # the field chat: "chat not found"
        yield fake


def _events(daemon: Daemon, *, running: bool = False) -> list[dict[str, Any]]:
    """Every line of the log as a JSON object; of a `running` daemon, not the last line if it is still being written."""
    text = daemon.log()
    lines = text.splitlines()
    if running and lines and not text.endswith("\n"):
        lines.pop()  # cut mid-write (no newline yet): complete on a later read
    events = []
    for line in lines:
        event = json.loads(line)  # every line is one JSON object
        assert isinstance(event, dict), line
        events.append(event)
    return events


def _find(daemon: Daemon, **fields: Any) -> dict[str, Any] | None:
    for event in _events(daemon, running=True):
        if all(event.get(k) == v for k, v in fields.items()):
            return event
    return None


def _one(daemon: Daemon, what: str, **fields: Any) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(lambda: _find(daemon, **fields), timeout=30, interval=0.05, what=what)
    return found


def test_json_logs_carry_the_ids_of_every_main_event(
    data_dir: Path, telegram: FakeTelegram, llm_stub: ScriptedLLM
) -> None:
    notes = data_dir / "groups" / "main" / "memory"
    notes.mkdir(parents=True, exist_ok=True)
    for n in range(500):
        (notes / f"plot-{n:03d}.md").write_text(f"# Plot {n}\nSoil moisture {n % 50} % on plot {n}.\n")
    llm_stub.script(Reply("The pump is fine."))
    env = clean_env(
        TZ=ZONE,
        TELEGRAM_BOT_TOKEN=BOT_TOKEN,
        TELEGRAM_API_BASE_URL=telegram.api_root,
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY=LLM_KEY,
        FARMHOST_AGENT_RUNTIME="process",
        FARMHOST_LOG_FORMAT="text",  # the option wins over the setting
    )
    daemon = Daemon(data_dir, env=env, args=("--log-format", "json", "-v")).start()
    try:
        # An IPC request: one line with its requestId and group.
        search = {"type": "memory_action", "action": "memory_search", "params": {"query": "plot 7"}}
        assert wait_result(data_dir, "main", drop(data_dir, "main", "actions", {**search, "requestId": "mem-1"}))
        request = _one(daemon, "the request line", requestId="mem-1")
        assert request["group"] == "main" and request["status"] == "success" and request["logger"].endswith("processor")
        assert request["type"] == "memory_action" and request["action"] == "memory_search"
        assert request["message"].startswith("request mem-1 (memory_action:memory_search) from group main: success")
        # The first index of 500 files said what it was doing.
        start = _one(daemon, "memory progress", event="memory_indexing", group="main")
        assert start["message"].startswith("indexing memory of group main: 0/") and start["files"] >= 500
        summary = _one(daemon, "memory summary", event="memory_indexed", group="main")
        assert summary["files"] >= 500 and summary["message"].startswith("indexed memory of group main: ")

        # A scheduled task runs an agent: the task's and the run's ids on their start and end lines.
        due = once_time(data_dir, "main", ZoneInfo(ZONE))
        task = {
            "type": "schedule_task",
            "requestId": "task-1",
            "taskId": "pump-check",
            "prompt": "Check the pump",
            "schedule_type": "once",
            "schedule_value": due.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        assert wait_result(data_dir, "main", drop(data_dir, "main", "tasks", task))["status"] == "success"
        task_start = _one(daemon, "task start", event="task_run_start", taskId="pump-check")
        run_start = _one(daemon, "run start", event="run_start", taskId="pump-check")
        run_end = _one(daemon, "run end", event="run_end", runId=run_start["runId"])
        task_end = _one(daemon, "task end", event="task_run_end", taskId="pump-check")
        assert task_start["group"] == run_start["group"] == task_end["group"] == "main"
        assert task_start["taskRunId"] == task_end["taskRunId"] and task_end["status"] == "ok"
        assert run_end["status"] == "ok" and run_end["exitCode"] == 0 and run_end["group"] == "main"
        assert f"agent run {run_start['runId']} for main ended: ok" in run_end["message"]

        # The outbox: a delivery (a debug line, shown with -v) and a failure, each with its entry id and chat.
        for folder, jid, rid in (("main", MAIN_JID, "msg-main"), ("field", FIELD_JID, "msg-field")):
            message = {"type": "message", "requestId": rid, "chatJid": jid, "text": f"Hello {folder}"}
            assert wait_result(data_dir, folder, drop(data_dir, folder, "messages", message))["status"] == "success"
        delivered = _one(daemon, "delivery", chat=MAIN_JID, level="DEBUG")
        failed = _one(daemon, "failed delivery", chat=FIELD_JID, level="ERROR")
        assert isinstance(delivered["entryId"], int) and isinstance(failed["entryId"], int)
        assert failed["group"] == "field" and "chat not found" in failed["message"].lower()
        assert f"outbox entry {failed['entryId']} " in failed["message"]
    finally:
        assert daemon.stop() == 0, daemon.log()

    events = _events(daemon)
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in events)
    assert all(e["ts"].endswith("Z") and len(e["ts"]) == len("2026-01-05T07:00:01.234Z") for e in events)
    assert events[-1]["message"] == "farmhost stopped"
    log = daemon.log()
    assert BOT_TOKEN not in log and LLM_KEY not in log and BOT_TOKEN.split(":")[1] not in log


def test_redaction_covers_messages_fields_and_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # configure() replaces them: pytest's capture comes back after
    secret = "sk-configured-secret-42"
    try:
        for log_format in ("json", "text"):
            configure("INFO", secrets=[secret], log_format=log_format)  # type: ignore[arg-type]
            log = logging.getLogger("farmhost.test")
            log.info("calling https://api.telegram.org/bot123:%s/getMe", "A" * 30, extra={"key": secret})
            try:
                raise RuntimeError(f"Authorization: Bearer {secret}")
            except RuntimeError:
                log.exception("request failed with %s", secret, extra={"requestId": "r-1"})
            text = capsys.readouterr().err
            assert secret not in text and "A" * 30 not in text and "<redacted>" in text
            if log_format == "json":
                first, second = (json.loads(line) for line in text.splitlines())
                assert first["key"] == "<redacted>" and second["requestId"] == "r-1"
                assert "RuntimeError" in second["exc"] and second["level"] == "ERROR"
            else:
                assert "Traceback" in text and "ERROR   farmhost.test: request failed with <redacted>" in text
        # A library's line per HTTP call (the Telegram long poll) shows with -v only.
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        configure("DEBUG", secrets=[])
        assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("httpx").setLevel(logging.NOTSET)


def test_a_bad_log_format_is_refused(tmp_path: Path) -> None:
    done = farmhost("run", "--log-format", "xml", data_dir=tmp_path / "data")
    assert done.returncode == 2 and "invalid choice: 'xml'" in done.stderr
    bad = farmhost("run", data_dir=tmp_path / "data", env=clean_env(FARMHOST_LOG_FORMAT="xml"))
    assert bad.returncode == 2 and bad.stderr.startswith("farmhost: error: FARMHOST_LOG_FORMAT:")
    assert not (tmp_path / "data").exists()


def test_a_log_line_shows_what_others_wrote_without_control_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hostile = "x\x1b]0;owned\x07\x9b2J\u202e\n2026-01-05 07:00:01,234 ERROR   farmhost.app: forged"
    try:
        for log_format in ("json", "text"):
            configure("INFO", secrets=[], log_format=log_format)  # type: ignore[arg-type]
            try:
                raise RuntimeError(hostile.split("\n")[0])
            except RuntimeError:
                logging.getLogger("farmhost.test").exception("agent said %s", hostile, extra={"text": hostile})
            text = capsys.readouterr().err
            for char in ("\x1b", "\x07", "\x9b", "\u202e"):
                assert char not in text, (log_format, text)
            if log_format == "json":
                (line,) = (json.loads(line) for line in text.splitlines())
                assert line["message"] == f"agent said {hostile}" and line["text"] == hostile
            else:  # one line for the message (the traceback keeps its own lines): no forged record
                assert "forged" in text.splitlines()[0]
                assert not any(line.startswith("2026-01-05") for line in text.splitlines())
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
