"""Issue 16 end to end: approval in the chat and rate limits for actuators, through the real daemon.

The real daemon, the real Home Assistant test instance and the fake Bot API. A control action the farm profile
puts under `requireApproval` answers `pending_approval` at once and asks the main chat; a press on Approve /
Deny decides it (once); the outcome reaches the asking group's chat and its agent's next run. Rates and ranges
refuse with sentences an agent can act on.

Requests are dropped into a group's IPC queue the way the in-sandbox client writes them (fast, and the result
file is what the agent reads); one test drives a real agent in bubblewrap from a chat message, one from a
scheduled task.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import (
    PRESSER,
    approval_asked,
    audit,
    db_rows,
    farm_daemon,
    press_answer,
    press_approval,
    sent_with,
    wait_counted,
    wait_state,
)
from farmagent.ipc.client import IpcClient
from farmhost_testing import FIELD_JID, MAIN_JID, drop, once_time, refused, wait_for, wait_result
from ha_fixture import HaInstance
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall
from telegram_stub import Call, FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = int(FIELD_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
VALVE_1 = "switch.field_1_valve"
VALVE_2 = "switch.field_2_valve"
DURATION = "number.irrigation_duration"
HUMIDITY_RAW = "input_number.air_humidity_raw"
ANA = PRESSER
BEA = 4242
# Both groups may switch things; everything else stays main only.
BOTH = {"ha_call_service": ["main", "field"], "ha_set_entity": ["main", "field"]}


# ---------------------------------------------------------------------------------------------- helpers


def _profile(data_dir: Path, rules: list[dict[str, Any]]) -> None:
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"actionGroups": BOTH, "rules": rules}}))


def _act(
    data_dir: Path, rid: str, params: dict[str, Any], *, action: str = "ha_set_entity", folder: str = "field"
) -> dict[str, Any]:
    """Drop a farm action the way an agent does and wait for its result."""
    drop(data_dir, folder, "actions", {"type": "farm_action", "action": action, "requestId": rid, "params": params})
    return wait_result(data_dir, folder, rid, timeout=20)


def _target(domain: str, service: str, entity_id: str) -> dict[str, Any]:
    return {"domain": domain, "service": service, "target": {"entity_id": entity_id}}


def _pump_on(rid: str, folder: str = "field") -> tuple[str, dict[str, Any], str]:
    return rid, {"entityId": PUMP, "value": "on"}, folder


def _pending(result: dict[str, Any]) -> str:
    refused(result, "pending_approval", "needs an approval in the farm's main chat")
    approval_id: str = result["result"]["approvalId"]
    assert approval_id.startswith("a-"), result
    return approval_id


def _edits(tg: FakeTelegram, asked: Call) -> list[str]:
    return [
        c.params["text"]
        for c in tg.calls
        if c.method == "editMessageText" and c.ok and c.params.get("message_id") == asked.result["message_id"]
    ]


def _wait_edit(tg: FakeTelegram, asked: Call, needle: str) -> str:
    text: str = wait_for(
        lambda: next((t for t in _edits(tg, asked) if needle in t), None),
        timeout=20,
        what=f"the approval message edited with {needle!r}",
        seen=lambda: _edits(tg, asked),
    )
    return text


def _wait_told(tg: FakeTelegram, chat_id: int, needle: str) -> str:
    told: list[str] = wait_for(
        lambda: sent_with(tg, chat_id, needle),
        timeout=20,
        what=f"a message with {needle!r} in chat {chat_id}",
        seen=lambda: tg.sent_texts(chat_id),
    )
    return told[0]


def _approval(data_dir: Path, approval_id: str) -> dict[str, Any]:
    (row,) = db_rows(data_dir, "SELECT * FROM approvals WHERE id = ?", approval_id)
    return row


def _wait_status(data_dir: Path, approval_id: str, status: str) -> dict[str, Any]:
    row: dict[str, Any] = wait_for(
        lambda: r if (r := _approval(data_dir, approval_id))["status"] == status else None,
        timeout=20,
        what=f"approval {approval_id} to be {status}",
        seen=lambda: _approval(data_dir, approval_id),
    )
    return row


def _state(ha: HaInstance, entity_id: str) -> str:
    state: str = ha.get_state(entity_id)["state"]
    return state


def _approval_notices(data_dir: Path) -> list[str]:
    rows = db_rows(data_dir, "SELECT DISTINCT message_key FROM outbox WHERE message_key LIKE 'approval:%'")
    return [row["message_key"] for row in rows]


# ---------------------------------------------------------------------------------------------- approval


def test_a_control_action_under_approval_answers_pending_approval_and_asks_the_main_chat(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [DURATION], "requireApproval": {"approvers": [ANA], "expiresMinutes": 10}}])
    before = _state(ha_reset, DURATION)
    params = {"domain": "number", "service": "set_value", "target": {"entity_id": DURATION}, "data": {"value": 45}}
    with farm_daemon(data_dir, ha_env, fake_telegram):
        result = _act(data_dir, "r-duration-45", params, action="ha_call_service")
        approval_id = _pending(result)
        asked = approval_asked(fake_telegram, approval_id)
        row = _approval(data_dir, approval_id)

    assert result["result"]["alreadyPending"] is False
    assert datetime.fromisoformat(result["result"]["expiresAt"]) == datetime.fromisoformat(row["expires_at"])
    assert "Nothing was done" in result["error"]
    assert _state(ha_reset, DURATION) == before  # nothing reached Home Assistant
    text = asked.text or ""
    for needle in (DURATION, "number.set_value", '"value": 45', "field", "r-duration-45", "expires at", str(ANA)):
        assert needle in text, (needle, text)
    assert asked.chat_id == MAIN_CHAT
    assert asked.params["reply_markup"] == {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": f"fa:{approval_id}:y"},
                {"text": "Deny", "callback_data": f"fa:{approval_id}:n"},
            ],
            [{"text": "Stop everything", "callback_data": "stop:all"}],
        ]
    }
    assert not fake_telegram.sent_texts(FIELD_CHAT)  # the asking group hears only the outcome
    assert (row["status"], row["group_folder"], row["request_id"], row["action"]) == (
        "pending", "field", "r-duration-45", "ha_call_service"
    )  # fmt: skip
    (line,) = audit(data_dir, "r-duration-45")
    assert (line["status"], line["errorCode"], line["group"]) == ("error", "pending_approval", "field")


def test_approve_runs_it_once_audits_the_approver_tells_the_group_and_the_agents_next_run(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    asked_for: list[str] = []

    def after_asking(request: Recorded) -> Reply:
        result = json.loads(request.last_tool_result() or "{}")
        asked_for.append(json.dumps(result))
        return Reply("I asked the farm's office to approve switching the pump on.")

    llm_stub.script(
        ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}),
        after_asking,
        Reply("The pump is running."),
    )
    llm = {
        "FARMHOST_AGENT_RUNTIME": "bwrap",
        "FARMHOST_LLM_BASE_URL": llm_stub.base_url,
        "FARMHOST_LLM_MODEL": "farm-model",
        "FARMHOST_LLM_API_KEY": "sk-e2e",
    }
    with farm_daemon(data_dir, ha_env, fake_telegram, **llm):
        fake_telegram.user_message(FIELD_CHAT, "@Field please switch the irrigation pump on")
        _wait_told(fake_telegram, FIELD_CHAT, "I asked the farm's office")
        (row,) = db_rows(data_dir, "SELECT * FROM approvals")
        approval_id = row["id"]
        asked = approval_asked(fake_telegram, approval_id)
        assert _state(ha_reset, PUMP) == "off"

        answer = press_approval(fake_telegram, asked, "y")
        edited = _wait_edit(fake_telegram, asked, "Approved by @ana and done.")
        wait_state(ha_reset, PUMP, "on")
        outcome = _wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")
        done = _wait_status(data_dir, approval_id, "done")

        assert done["reported"] == 0  # not told yet: its agent has not run since
        fake_telegram.user_message(FIELD_CHAT, "@Field is the pump running now?")
        _wait_told(fake_telegram, FIELD_CHAT, "The pump is running.")
        reported = _approval(data_dir, approval_id)["reported"]

    assert asked_for and "pending_approval" in asked_for[0] and approval_id in asked_for[0]
    assert answer == "Approved: running it now."
    assert edited.startswith(asked.text or "")
    assert "approved by @ana and done" in outcome and PUMP in outcome
    assert not sent_with(fake_telegram, MAIN_CHAT, "approved by @ana and done")  # the outcome goes to the group
    assert (done["decided_by"], done["outcome"], reported) == ("@ana", "approved by @ana and done", 1)
    ran = [line for line in audit(data_dir, row["request_id"]) if line["status"] == "success"]
    assert len(ran) == 1, audit(data_dir)
    assert (ran[0]["approvalId"], ran[0]["approvedBy"], ran[0]["group"]) == (approval_id, "@ana", "field")
    assert ran[0]["params"] == {"entityId": PUMP, "value": "on"}
    # the agent's next run was told, at the top of its prompt, and only that run
    third = llm_stub.requests[2]
    prompt = third.text()
    assert "[farmhost: since your last run]" in prompt
    assert f"approval {approval_id}" in prompt and "was done: approved by @ana and done" in prompt
    assert "[farmhost: since your last run]" not in llm_stub.requests[0].text()
    # the approved run's own effect was permitted: the rules on effects did not undo it (issue 32)
    assert not [line for line in audit(data_dir) if line["action"] == "violation"], audit(data_dir)


def test_deny_runs_nothing_is_audited_and_the_group_is_told(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    rid, params, folder = _pump_on("r-deny")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, rid, params, folder=folder))
        asked = approval_asked(fake_telegram, approval_id)
        answer = press_approval(fake_telegram, asked, "n")
        edited = _wait_edit(fake_telegram, asked, "Denied by @ana")
        told = _wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")
        row = _wait_status(data_dir, approval_id, "denied")

    assert answer == "Denied: nothing is done."
    assert "nothing was done" in edited
    assert "denied by @ana; nothing was done" in told
    assert _state(ha_reset, PUMP) == "off"
    assert row["decided_by"] == "@ana"
    lines = audit(data_dir, rid)
    assert [line.get("decision") for line in lines] == [None, "denied"]
    assert lines[1]["decidedBy"] == "@ana" and lines[1]["approvalId"] == approval_id
    assert not [line for line in lines if line["status"] == "success"]


def test_an_unanswered_approval_expires_and_a_late_press_does_nothing(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": {"expiresMinutes": 0.05}}])
    rid, params, folder = _pump_on("r-expire")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, rid, params, folder=folder))
        asked = approval_asked(fake_telegram, approval_id)
        row = _wait_status(data_dir, approval_id, "expired")
        told = _wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")
        answer = press_approval(fake_telegram, asked, "y")

    assert "expired: nobody approved it in time, nothing was done" in told
    assert row["outcome"] == "nobody approved it in time"
    assert "expired" in answer and "nothing" in answer, answer
    assert _state(ha_reset, PUMP) == "off"
    assert _approval(data_dir, approval_id)["status"] == "expired"
    lines = audit(data_dir, rid)
    assert [line.get("decision") for line in lines] == [None, "expired"]
    assert not [line for line in lines if line["status"] == "success"]


def test_a_press_by_someone_not_among_the_approvers_is_refused_and_an_approver_can_still_approve(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": {"approvers": [BEA]}}])
    rid, params, folder = _pump_on("r-approvers")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, rid, params, folder=folder))
        asked = approval_asked(fake_telegram, approval_id)
        refusal = press_approval(fake_telegram, asked, "y", user_id=ANA, username="ana")
        assert _approval(data_dir, approval_id)["status"] == "pending"
        assert _state(ha_reset, PUMP) == "off"
        refused_audit = [line for line in audit(data_dir, rid) if line.get("decision") == "refused press"]

        answer = press_approval(fake_telegram, asked, "y", user_id=BEA, username="bea")
        wait_state(ha_reset, PUMP, "on")
        row = _wait_status(data_dir, approval_id, "done")

    assert refusal == "You are not one of this approval's approvers."
    assert answer == "Approved: running it now."
    (line,) = refused_audit
    assert line["decidedBy"] == "@ana" and line["approvalId"] == approval_id and line["status"] == "error"
    assert row["decided_by"] == "@bea"
    (ran,) = [line for line in audit(data_dir, rid) if line["status"] == "success"]
    assert ran["approvedBy"] == "@bea"


def test_a_call_on_entity_id_all_cannot_slip_past_a_rule(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # Home Assistant reads entity_id "all" as every entity of the domain: the pump too
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        by_target = _act(
            data_dir,
            "r-all-target",
            {"domain": "switch", "service": "turn_on", "target": {"entity_id": "all"}},
            action="ha_call_service",
        )
        by_data = _act(
            data_dir,
            "r-all-data",
            {"domain": "switch", "service": "turn_on", "data": {"entity_id": ["all"]}},
            action="ha_call_service",
        )

    refused(by_target, "not_allowed", PUMP, "target.entity_id")
    refused(by_data, "not_allowed", PUMP)
    assert _state(ha_reset, PUMP) == "off"
    assert not db_rows(data_dir, "SELECT * FROM approvals")


def test_a_second_press_or_a_replayed_button_after_approval_runs_nothing_again(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # a toggle: run twice, the pump would be back off
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    params = {"domain": "switch", "service": "toggle", "target": {"entity_id": PUMP}}
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, "r-toggle", params, action="ha_call_service"))
        asked = approval_asked(fake_telegram, approval_id)
        data = f"fa:{approval_id}:y"
        first = fake_telegram.callback_query(MAIN_CHAT, asked.result["message_id"], data, user_id=ANA)
        assert press_answer(fake_telegram, first) == "Approved: running it now."
        _wait_status(data_dir, approval_id, "done")
        wait_state(ha_reset, PUMP, "on")
        _wait_told(fake_telegram, FIELD_CHAT, "approved by @ana and done")
        second = press_approval(fake_telegram, asked, "y")
        deny_after = press_approval(fake_telegram, asked, "n")
        fake_telegram.redeliver(first["update_id"])  # Telegram delivering the same press again
        fake_telegram.wait_confirmed(first["update_id"])
        later = fake_telegram.callback_query(MAIN_CHAT, asked.result["message_id"], data, user_id=ANA)
        third = press_answer(fake_telegram, later)  # answered after the replay was handled (updates are in order)

    assert second == third == "This approval was already approved by @ana; nothing more is done."
    assert deny_after == second
    assert _state(ha_reset, PUMP) == "on"
    assert len([line for line in audit(data_dir, "r-toggle") if line["status"] == "success"]) == 1
    assert len(sent_with(fake_telegram, FIELD_CHAT, "approved by @ana and done")) == 1  # told once


def test_the_same_call_while_pending_gets_the_same_approval_and_one_message(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP, VALVE_1], "requireApproval": True}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        first = _act(data_dir, "r-same-1", {"entityId": PUMP, "value": "on"})
        approval_id = _pending(first)
        approval_asked(fake_telegram, approval_id)
        again = _act(data_dir, "r-same-2", {"entityId": PUMP, "value": "on"})
        other = _act(data_dir, "r-other", {"entityId": VALVE_1, "value": "on"})
        other_id = _pending(other)
        approval_asked(fake_telegram, other_id)
        notices = _approval_notices(data_dir)
        rows = db_rows(data_dir, "SELECT id FROM approvals ORDER BY created_at")

    assert _pending(again) == approval_id
    assert again["result"]["alreadyPending"] is True and first["result"]["alreadyPending"] is False
    assert "still waiting" in again["error"]
    assert other_id != approval_id  # another entity: another approval
    assert sorted(notices) == sorted([f"approval:{approval_id}", f"approval:{other_id}"])
    assert len([t for t in fake_telegram.sent_texts(MAIN_CHAT) if approval_id in t]) == 1
    assert [r["id"] for r in rows] == [approval_id, other_id]


def test_calls_of_one_effect_in_the_effects_table_share_one_approval(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # The approval's identity is the state the call leads to, read from farm/control/effects.py: lock.open
    # unlocks the door as lock.unlock does, and a light.toggle (on or off) is its own request.
    door = "lock.barn_door"
    ha_reset.write_state(door, "locked", {"friendly_name": "Barn door"})
    _profile(
        data_dir,
        [{"entities": [door], "requireApproval": True}, {"services": ["light.turn_on"], "requireApproval": True}],
    )
    with farm_daemon(data_dir, ha_env, fake_telegram):
        unlock = _act(data_dir, "r-unlock", _target("lock", "unlock", door), action="ha_call_service")
        approval_id = _pending(unlock)
        approval_asked(fake_telegram, approval_id)
        opened = _act(data_dir, "r-open", _target("lock", "open", door), action="ha_call_service")
        light_on = _act(
            data_dir, "r-light-on", _target("light", "turn_on", "light.barn_light"), action="ha_call_service"
        )
        light_id = _pending(light_on)
        approval_asked(fake_telegram, light_id)
        set_on = _act(data_dir, "r-light-set", {"entityId": "light.barn_light", "value": "on"})
        toggled = _act(
            data_dir, "r-light-toggle", _target("light", "toggle", "light.barn_light"), action="ha_call_service"
        )
        rows = db_rows(data_dir, "SELECT id FROM approvals ORDER BY created_at")

    assert _pending(opened) == approval_id and opened["result"]["alreadyPending"] is True
    assert _pending(set_on) == light_id and set_on["result"]["alreadyPending"] is True
    toggle_id = _pending(toggled)
    assert toggle_id not in (approval_id, light_id) and toggled["result"]["alreadyPending"] is False
    assert [r["id"] for r in rows] == [approval_id, light_id, toggle_id]
    assert ha_reset.get_state(door)["state"] == "locked" and _state(ha_reset, "light.barn_light") == "off"


def test_an_approval_survives_a_restart_of_thefarm_daemon(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    rid, params, folder = _pump_on("r-restart")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, rid, params, folder=folder))
        asked = approval_asked(fake_telegram, approval_id)
    assert _approval(data_dir, approval_id)["status"] == "pending"
    with farm_daemon(data_dir, ha_env, fake_telegram):
        answer = press_approval(fake_telegram, asked, "y")
        wait_state(ha_reset, PUMP, "on")
        row = _wait_status(data_dir, approval_id, "done")
        told = _wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")

    assert answer == "Approved: running it now."
    assert row["decided_by"] == "@ana" and "approved by @ana and done" in told
    (ran,) = [line for line in audit(data_dir, rid) if line["status"] == "success"]
    assert ran["approvalId"] == approval_id


def test_an_approval_pressed_after_the_profile_narrowed_its_approvers_runs_nothing(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # Asked while any member could approve; then the farmer names one approver in the profile. A press by
    # another member must not run the call: the approval is checked against the rules when it runs.
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    rid, params, folder = _pump_on("r-narrowed")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id = _pending(_act(data_dir, rid, params, folder=folder))
        asked = approval_asked(fake_telegram, approval_id)
        _profile(data_dir, [{"entities": [PUMP], "requireApproval": {"approvers": [BEA]}}])
        answer = press_approval(fake_telegram, asked, "y", user_id=ANA, username="ana")
        row = _wait_status(data_dir, approval_id, "failed")
        told = _wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")
        state = _state(ha_reset, PUMP)

    assert state == "off"
    assert answer == "Approved: running it now."  # the row's own approvers allowed @ana when it was asked
    assert "not among the approvers" in row["outcome"] and str(BEA) in row["outcome"], row
    assert "not among the approvers" in told
    (ran,) = [line for line in audit(data_dir, rid) if line.get("approvalId") == approval_id]
    assert (ran["errorCode"], ran["approvedBy"]) == ("not_allowed", "@ana"), ran


def test_rules_whose_approver_lists_share_no_one_refuse_at_once_and_ask_nobody(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # Every named list must allow the approver: two lists with no one in common leave nobody who could approve.
    _profile(
        data_dir,
        [
            {"entities": [PUMP], "requireApproval": {"approvers": [ANA]}},
            {"services": ["switch.turn_on"], "requireApproval": {"approvers": [BEA]}},
        ],
    )
    rid, params, folder = _pump_on("r-nobody")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        result = _act(data_dir, rid, params, folder=folder)

    refused(result, "not_allowed", "no one is in every list", str(ANA), str(BEA), "Nothing was done")
    assert not db_rows(data_dir, "SELECT * FROM approvals")
    assert not _approval_notices(data_dir)
    assert [line["errorCode"] for line in audit(data_dir, rid)] == ["not_allowed"]


def test_a_call_too_long_to_show_the_approvers_in_one_message_asks_nobody(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # Service data is free-form and a request file may be 1 MiB: asked as it is, one call would flood the main
    # chat with hundreds of chunks the approvers cannot read as one, the real effect buried among them.
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    params = {**_target("switch", "turn_on", PUMP), "data": {"note": "approve me " * 2000}}
    with farm_daemon(data_dir, ha_env, fake_telegram):
        result = _act(data_dir, "r-long", params, action="ha_call_service")

    refused(result, "invalid_request", "too long to show the approvers", "Nothing was done and nobody was asked")
    assert not db_rows(data_dir, "SELECT * FROM approvals")
    assert not _approval_notices(data_dir)
    assert not fake_telegram.sent_texts(MAIN_CHAT)
    assert [line["errorCode"] for line in audit(data_dir, "r-long")] == ["invalid_request"]


# ---------------------------------------------------------------------------------------------- rates and ranges


def test_max_calls_per_hour_refuses_with_rate_limited_and_a_sentence(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "maxCallsPerHour": 2}])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        # Rates count effects (issue 32): each "on" counts once it happened; the offs, the safe direction, do not.
        assert _act(data_dir, "r-rate-1", {"entityId": PUMP, "value": "on"})["status"] == "success"
        wait_counted(data_dir, PUMP, 1)
        assert _act(data_dir, "r-rate-2", {"entityId": PUMP, "value": "off"})["status"] == "success"
        assert _act(data_dir, "r-rate-3", {"entityId": PUMP, "value": "on"})["status"] == "success"
        wait_counted(data_dir, PUMP, 2)
        ha_reset.call_service("switch", "turn_off", {"entity_id": PUMP})  # by a person
        fifth = _act(data_dir, "r-rate-5", {"entityId": PUMP, "value": "on"})
        assert _state(ha_reset, PUMP) == "off"
        daemon.stop()
        daemon.start(timeout=30)  # the count is in the database: a restart forgets nothing
        sixth = _act(data_dir, "r-rate-6", {"entityId": PUMP, "value": "on"})

    message = refused(fifth, "rate_limited")
    assert message.startswith(
        "the irrigation pump (switch.irrigation_pump) was switched 2 times in the last hour; the limit is 2"
    ), message
    assert refused(sixth, "rate_limited") == message
    assert _state(ha_reset, PUMP) == "off"
    assert len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", PUMP)) == 2  # refusals not counted
    assert [line["errorCode"] for line in audit(data_dir) if line["action"] == "ha_set_entity"] == [
        None, None, None, "rate_limited", "rate_limited"
    ]  # fmt: skip


def test_min_seconds_between_refuses_a_second_change_too_soon(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": ["switch.field_*_valve"], "minSecondsBetween": 600}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        assert _act(data_dir, "r-valve-1", {"entityId": VALVE_1, "value": "on"})["status"] == "success"
        wait_counted(data_dir, VALVE_1, 1)
        again = _act(
            data_dir,
            "r-valve-2",
            {"domain": "switch", "service": "toggle", "target": {"entity_id": VALVE_1}},
            action="ha_call_service",
        )
        other = _act(data_dir, "r-valve-3", {"entityId": VALVE_2, "value": "on"})  # counted per entity

    message = refused(again, "rate_limited", "the farm profile allows one change every 600 s")
    assert message.startswith("the field 1 valve (switch.field_1_valve) was switched "), message
    assert "Nothing was done: try again in " in message
    assert _state(ha_reset, VALVE_1) == "on"
    assert other["status"] == "success" and _state(ha_reset, VALVE_2) == "on"


def test_value_range_refuses_a_number_outside_it_and_lets_one_inside_through(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [DURATION], "valueRange": [0, 120]}])
    before = float(_state(ha_reset, DURATION))
    with farm_daemon(data_dir, ha_env, fake_telegram):
        high = _act(data_dir, "r-range-high", {"entityId": DURATION, "value": 150})
        by_service = _act(
            data_dir,
            "r-range-service",
            {"domain": "number", "service": "set_value", "target": {"entity_id": DURATION}, "data": {"value": 200}},
            action="ha_call_service",
        )
        by_area = _act(
            data_dir,
            "r-range-area",
            {"domain": "number", "service": "set_value", "target": {"area_id": "field"}, "data": {"value": 60}},
            action="ha_call_service",
        )
        unchanged = float(_state(ha_reset, DURATION))
        inside = _act(data_dir, "r-range-ok", {"entityId": DURATION, "value": 60})

    assert refused(high, "not_allowed") == (
        "the farm profile keeps number.irrigation_duration between 0 and 120; 150 is outside that range"
    )
    refused(by_service, "not_allowed", "200 is outside that range")
    refused(by_area, "not_allowed", "target.entity_id", DURATION)
    assert unchanged == before
    assert inside["status"] == "success" and float(_state(ha_reset, DURATION)) == 60


def test_a_number_to_the_low_end_of_its_own_range_is_never_held_by_approval(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # No valueRange: the safe state is the low end of the entity's own range (HA's `min`, 0 here).
    _profile(data_dir, [{"entities": [HUMIDITY_RAW], "requireApproval": True}])
    assert ha_reset.get_state(HUMIDITY_RAW)["attributes"]["min"] == 0
    set_value = {"domain": "input_number", "service": "set_value", "target": {"entity_id": HUMIDITY_RAW}}
    with farm_daemon(data_dir, ha_env, fake_telegram):
        by_entity = _act(data_dir, "r-humidity-low", {"entityId": HUMIDITY_RAW, "value": 0})
        low = _state(ha_reset, HUMIDITY_RAW)
        ha_reset.set_number(HUMIDITY_RAW, 65)  # by a person
        by_service = _act(data_dir, "r-humidity-low-2", {**set_value, "data": {"value": 0}}, action="ha_call_service")
        again = _state(ha_reset, HUMIDITY_RAW)
        up = _act(data_dir, "r-humidity-up", {"entityId": HUMIDITY_RAW, "value": 50})

    assert by_entity["status"] == "success" and float(low) == 0, by_entity
    assert by_service["status"] == "success" and float(again) == 0, by_service
    _pending(up)  # the rule itself holds
    assert float(_state(ha_reset, HUMIDITY_RAW)) == 0
    assert len(_approval_notices(data_dir)) == 1  # only the raise asked anyone


def test_a_number_to_the_low_end_of_its_own_range_is_never_held_by_rate(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [HUMIDITY_RAW], "maxCallsPerHour": 1}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        assert _act(data_dir, "r-humidity-50", {"entityId": HUMIDITY_RAW, "value": 50})["status"] == "success"
        wait_counted(data_dir, HUMIDITY_RAW, 1)
        low = _act(data_dir, "r-humidity-0", {"entityId": HUMIDITY_RAW, "value": 0})
        at_low = _state(ha_reset, HUMIDITY_RAW)
        up = _act(data_dir, "r-humidity-40", {"entityId": HUMIDITY_RAW, "value": 40})

    assert low["status"] == "success" and float(at_low) == 0, low
    refused(up, "rate_limited", "the limit is 1")
    assert float(_state(ha_reset, HUMIDITY_RAW)) == 0


# ---------------------------------------------------------------------------------------------- scheduled runs


def test_a_scheduled_tasks_agent_run_is_held_for_approval_the_same_way(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
) -> None:
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True}])
    llm_stub.script(ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}), Reply("Asked for the pump."))
    llm = {
        "FARMHOST_AGENT_RUNTIME": "bwrap",
        "FARMHOST_LLM_BASE_URL": llm_stub.base_url,
        "FARMHOST_LLM_MODEL": "farm-model",
        "FARMHOST_LLM_API_KEY": "sk-e2e",
    }
    with farm_daemon(data_dir, ha_env, fake_telegram, **llm):
        agent = IpcClient(data_dir / "ipc" / "field")
        due = once_time(data_dir, "field", UTC)
        agent.schedule_task("Start the morning irrigation.", "once", due.isoformat())
        rows = wait_for(
            lambda: db_rows(data_dir, "SELECT * FROM approvals"), timeout=30, what="an approval from the task's run"
        )
        asked = approval_asked(fake_telegram, rows[0]["id"])
        llm_stub.wait_requests(2)

    (row,) = rows
    assert row["group_folder"] == "field" and row["status"] == "pending"
    assert "field" in (asked.text or "") and PUMP in (asked.text or "")
    assert _state(ha_reset, PUMP) == "off"
    assert "pending_approval" in (llm_stub.requests[1].last_tool_result() or "")
