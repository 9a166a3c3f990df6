"""One door (issue 35): what the host runs as a group itself goes through the router like any agent's request.

An approved call and an answer of the Assist fallback leave what every request leaves: an entry in the ledger
under the group and a line in `logs/requests.ndjson` (with `via`, who in the host asked, instead of a file), and
the ledger runs one id once. Everything is real: the daemon, Home Assistant's test instance, the fake Bot API.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit, db_rows, farm_daemon, sent_with, wait_state
from farmhost_testing import FIELD_JID, MAIN_JID, drop, wait_for, wait_result
from ha_fixture import HaInstance
from telegram_stub import Call, FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = int(FIELD_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
TOGGLE = {"domain": "switch", "service": "toggle", "target": {"entity_id": PUMP}}


def _profile(data_dir: Path, policy: dict[str, Any]) -> None:
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))


def _logged(data_dir: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    path = data_dir / "logs" / "requests.ndjson"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if request_id is None or line.get("requestId") == request_id]


def _ledger(data_dir: Path, request_id: str) -> list[dict[str, Any]]:
    return db_rows(data_dir, "SELECT * FROM request_ledger WHERE request_id = ?", request_id)


def _asked(tg: FakeTelegram, approval_id: str) -> Call:
    found: Call = wait_for(
        lambda: next((c for c in tg.sent(MAIN_CHAT) if approval_id in (c.text or "")), None),
        timeout=15,
        what=f"the approval message of {approval_id}",
    )
    return found


def _approve(tg: FakeTelegram, asked: Call, approval_id: str) -> None:
    tg.callback_query(MAIN_CHAT, asked.result["message_id"], f"fa:{approval_id}:y", user_id=MAIN_CHAT)  # its member


def _status(data_dir: Path, approval_id: str, status: str) -> dict[str, Any]:
    row: dict[str, Any] = wait_for(
        lambda: (
            r
            if (r := db_rows(data_dir, "SELECT * FROM approvals WHERE id = ?", approval_id)[0])["status"] == status
            else None
        ),
        timeout=20,
        what=f"approval {approval_id} to be {status}",
    )
    return row


def _undecide(data_dir: Path, approval_id: str) -> None:
    """Put a decided approval back to pending, on a connection of our own."""
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn, conn:
        conn.execute(
            "UPDATE approvals SET status = 'pending', decided_by = NULL, decided_at = NULL, outcome = NULL "
            "WHERE id = ?",
            (approval_id,),
        )


def _ask_toggle(data_dir: Path, tg: FakeTelegram, rid: str) -> tuple[str, Call]:
    drop(data_dir, "field", "actions", {"type": "farm_action", "action": "ha_call_service", "requestId": rid,
                                        "params": TOGGLE})  # fmt: skip
    result = wait_result(data_dir, "field", rid, timeout=20)
    assert result["errorCode"] == "pending_approval", result
    approval_id: str = result["result"]["approvalId"]
    return approval_id, _asked(tg, approval_id)


def test_an_approved_call_leaves_a_ledger_entry_and_a_request_log_line_as_its_group(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, {"actionGroups": {"ha_call_service": ["main", "field"]},
                        "rules": [{"entities": [PUMP], "requireApproval": True}]})  # fmt: skip
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id, asked = _ask_toggle(data_dir, fake_telegram, "r-door-approved")
        _approve(fake_telegram, asked, approval_id)
        _status(data_dir, approval_id, "done")
        wait_state(ha_reset, PUMP, "on")
        door_id = f"approval:{approval_id}"
        line = wait_for(lambda: next(iter(_logged(data_dir, door_id)), None), timeout=10, what="its request log line")

    (entry,) = _ledger(data_dir, door_id)
    assert (entry["folder"], entry["queue"], entry["kind"], entry["action"], entry["state"]) == (
        "field", "actions", "farm_action", "ha_call_service", "done"
    )  # fmt: skip
    document = json.loads(entry["result"])
    assert (document["requestId"], document["status"], document["errorCode"]) == (door_id, "success", None)
    assert (line["group"], line["queue"], line["via"], line["type"], line["action"]) == (
        "field", "actions", "approval", "farm_action", "ha_call_service"
    )  # fmt: skip
    assert (line["status"], line["errorCode"], line["replayed"]) == ("success", None, False)
    assert "file" not in line  # nothing was written into the group's IPC directory
    # the audit line keeps naming the request that asked, with the approval and the approver
    (ran,) = [a for a in audit(data_dir, "r-door-approved") if a["status"] == "success"]
    assert (ran["approvalId"], ran["approvedBy"], ran["group"]) == (approval_id, "@ana", "field")


def test_an_approval_decided_a_second_time_does_not_run_its_call_again(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # A toggle: run twice, the pump would be back off. The desk lets one press through; should a second decision
    # ever slip past it (here: the approval's row put back to pending behind the desk's back), the ledger, keyed
    # by the approval, answers with the stored result instead of running the call again.
    _profile(data_dir, {"actionGroups": {"ha_call_service": ["main", "field"]},
                        "rules": [{"entities": [PUMP], "requireApproval": True}]})  # fmt: skip
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id, asked = _ask_toggle(data_dir, fake_telegram, "r-door-twice")
        _approve(fake_telegram, asked, approval_id)
        _status(data_dir, approval_id, "done")
        wait_state(ha_reset, PUMP, "on")
        door_id = f"approval:{approval_id}"
        wait_for(lambda: _logged(data_dir, door_id), timeout=10, what="the first run's request log line")
        _undecide(data_dir, approval_id)
        _approve(fake_telegram, asked, approval_id)
        _status(data_dir, approval_id, "done")
        lines = wait_for(
            lambda: found if len(found := _logged(data_dir, door_id)) == 2 else None,
            timeout=10,
            what="the second decision's request log line",
        )

    assert ha_reset.get_state(PUMP)["state"] == "on"  # toggled once
    assert len([a for a in audit(data_dir, "r-door-twice") if a["status"] == "success"]) == 1
    assert [(line["status"], line["replayed"]) for line in lines] == [("success", False), ("success", True)]
    assert len(_ledger(data_dir, door_id)) == 1
    assert len(sent_with(fake_telegram, FIELD_CHAT, "approved by @ana and done")) == 1  # told once


def test_an_assist_answer_and_an_assist_refusal_leave_a_ledger_entry_and_a_request_log_line(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    with farm_daemon(data_dir, ha_env, fake_telegram, FARMHOST_AGENT_RUNTIME="bwrap"):
        fake_telegram.user_message(MAIN_CHAT, "is the barn light on", chat_type="private", title=None)
        fake_telegram.wait_sent(2, chat_id=MAIN_CHAT, timeout=30)  # the one-time notice and Assist's answer
        fake_telegram.user_message(FIELD_CHAT, "@field is the barn light on", title="Field crew")
        fake_telegram.wait_sent(1, chat_id=FIELD_CHAT, timeout=30)  # refused: ha_assist is main only
        lines = wait_for(
            lambda: found if len(found := [x for x in _logged(data_dir) if x.get("via") == "assist"]) == 2 else None,
            timeout=10,
            what="two request log lines of the Assist fallback",
            seen=lambda: _logged(data_dir),
        )

    refused, answered = sorted(lines, key=lambda line: line["group"])  # field, main
    assert (answered["group"], answered["action"], answered["status"]) == ("main", "ha_assist", "success")
    assert (refused["group"], refused["status"], refused["errorCode"]) == ("field", "error", "unauthorized")
    for line in lines:
        assert line["requestId"].startswith("assist:"), line  # an id no agent can write
        assert "file" not in line
        (entry,) = _ledger(data_dir, line["requestId"])
        assert (entry["folder"], entry["kind"], entry["action"]) == (line["group"], "farm_action", "ha_assist")
        assert json.loads(entry["result"])["status"] == line["status"]
