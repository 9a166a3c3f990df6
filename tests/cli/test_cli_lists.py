"""`farmhost task list` and `farmhost outbox list` show what agents did, as text and as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from farmhost_testing import FIELD_JID, Daemon, drop, farmhost, wait_result


def _json(*args: str, data_dir: Path) -> list[dict[str, Any]]:
    done = farmhost(*args, "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


def test_task_and_outbox_lists(daemon: Daemon, data_dir: Path) -> None:
    empty_tasks = farmhost("task", "list", data_dir=data_dir)
    assert empty_tasks.returncode == 0 and "no tasks" in empty_tasks.stdout
    empty_box = farmhost("outbox", "list", data_dir=data_dir)
    assert empty_box.returncode == 0 and "outbox is empty" in empty_box.stdout

    schedule = {
        "type": "schedule_task",
        "prompt": "Check the greenhouse",
        "schedule_type": "cron",
        "schedule_value": "0 7 * * *",
        "taskId": "greenhouse-check",
    }
    assert wait_result(data_dir, "field", drop(data_dir, "field", "tasks", schedule))["status"] == "success"
    message = {"type": "message", "chatJid": FIELD_JID, "text": "Gate 3 is open"}
    assert wait_result(data_dir, "field", drop(data_dir, "field", "messages", message))["status"] == "success"

    (task,) = _json("task", "list", data_dir=data_dir)
    assert task["id"] == "greenhouse-check" and task["groupFolder"] == "field"
    assert task["schedule_type"] == "cron" and task["schedule_value"] == "0 7 * * *"
    assert task["status"] == "active" and task["next_run"]
    text = farmhost("task", "list", data_dir=data_dir).stdout
    assert (
        "greenhouse-check" in text and "field" in text and "cron 0 7 * * *" in text and "Check the greenhouse" in text
    )

    (entry,) = _json("outbox", "list", data_dir=data_dir)
    assert entry["chatJid"] == FIELD_JID and entry["sourceFolder"] == "field"
    assert entry["body"] == "Gate 3 is open" and entry["kind"] == "text"
    # Telegram is off in this daemon: nothing can be sent, so the entry stays pending.
    assert entry["status"] == "pending"
    assert _json("outbox", "list", "--status", "pending", data_dir=data_dir) == [entry]
    assert _json("outbox", "list", "--status", "sent", data_dir=data_dir) == []
    text = farmhost("outbox", "list", data_dir=data_dir).stdout
    assert FIELD_JID in text and "Gate 3 is open" in text and "pending" in text


# What a terminal acts on rather than shows: C0 controls but the line break, DEL, C1 controls (0x9b is CSI on
# xterm), and the bidi overrides that make a line read differently from its bytes.
_UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_HOSTILE = "Gate \x1b]0;owned\x07\x1b[2J\x9b31m open\u202etxt.exe\rDONE"


def test_agent_text_reaches_the_operators_terminal_without_its_control_sequences(
    daemon: Daemon, data_dir: Path
) -> None:
    message = {"type": "message", "chatJid": FIELD_JID, "text": _HOSTILE}
    assert wait_result(data_dir, "field", drop(data_dir, "field", "messages", message))["status"] == "success"
    schedule = {"type": "schedule_task", "prompt": _HOSTILE, "schedule_type": "cron", "schedule_value": "0 7 * * *"}
    assert wait_result(data_dir, "field", drop(data_dir, "field", "tasks", schedule))["status"] == "success"
    register = {"type": "register_group", "jid": "telegram:300", "name": _HOSTILE, "folder": "orchard"}
    assert wait_result(data_dir, "main", drop(data_dir, "main", "tasks", register))["status"] == "success"

    for command in (("outbox", "list"), ("task", "list"), ("group", "list")):
        for extra in ((), ("--json",)):
            done = farmhost(*command, *extra, data_dir=data_dir)
            assert done.returncode == 0, done.stderr
            assert not _UNSAFE.search(done.stdout), (command, extra, done.stdout)
            assert "open" in done.stdout and "DONE" in done.stdout  # the words are kept, the controls are not
    (entry,) = _json("outbox", "list", data_dir=data_dir)
    assert entry["body"] == _HOSTILE  # --json escapes them: the machine-readable text is the exact text
