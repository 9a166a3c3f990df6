"""Issue 32, point 9 end to end: `/stop` and the Stop everything button in the main chat, and `/resume`.

The real daemon, the real Home Assistant test instance and the fake Bot API. A stop puts every entity a farm
profile rule names in its safe state in Home Assistant (the pump and a valve off, the ranged irrigation duration
at the low end of its range), pauses agents with the stored pause of the MQTT switch (a scheduled task does not
start an agent, a restart keeps it), denies the pending approvals, is audited and answered with the names. Only
the main chat's members may stop; a forged or replayed button press does nothing; `/resume` lifts the pause and
turns nothing back on.
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import ask_approval, audit, db_rows, farm_daemon, press_answer, sent_with, wait_state, wait_told
from farmhost_testing import FIELD_JID, MAIN_JID, drop, farmhost, once_time, refused, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

from farmhost.localha.client import http_json

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = int(FIELD_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
VALVE_1 = "switch.field_1_valve"
VALVE_2 = "switch.field_2_valve"
DURATION = "number.irrigation_duration"
PROGRAM = "select.fertigation_program"
BARN_LIGHT = "light.barn_light"
FAN = "fan.greenhouse_fan"
ANA = MAIN_CHAT  # the main chat is Ana's private chat with the bot (@ana)
BEA = 4242
STOP_BUTTON = {"inline_keyboard": [[{"text": "Stop everything", "callback_data": "stop:all"}]]}
RULES: list[dict[str, Any]] = [
    {"entities": [PUMP], "requireApproval": True},
    {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 4},
    {"entities": [DURATION], "valueRange": [0, 120]},
    {"entities": [PROGRAM], "requireApproval": True},  # a select: no safe state unless the rule names one
]


def _profile(data_dir: Path) -> None:
    policy = {"actionGroups": {"ha_set_entity": ["main", "field"]}, "rules": RULES}
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))


def _update_row(data_dir: Path, update: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = wait_for(
        lambda: next(iter(db_rows(data_dir, "SELECT * FROM telegram_updates WHERE update_id = ?", update["update_id"])),
                     None),
        timeout=scaled(20),
        what=f"update {update['update_id']} to be processed",
    )  # fmt: skip
    return row


def _paused(data_dir: Path) -> str | None:
    rows = db_rows(data_dir, "SELECT value FROM host_state WHERE key = 'agents_paused'")
    return rows[0]["value"] if rows else None


def _stops(data_dir: Path) -> list[dict[str, Any]]:
    return [line for line in audit(data_dir) if line["action"] == "emergency_stop"]


def _schedule_now(data_dir: Path, task_id: str) -> dict[str, Any]:
    """A task of the main group due in a moment; returns its finished run (the daemon must be running)."""
    due = once_time(data_dir, "main", UTC).isoformat()
    rid = f"r-{task_id}"
    task = {"type": "schedule_task", "requestId": rid, "taskId": task_id, "prompt": "open field 1 for an hour"}
    drop(data_dir, "main", "tasks", {**task, "schedule_type": "once", "schedule_value": due})
    assert wait_result(data_dir, "main", rid, timeout=20)["status"] == "success"
    run: dict[str, Any] = wait_for(
        lambda: next(
            iter(db_rows(data_dir, "SELECT * FROM task_runs WHERE task_id = ? AND finished_at IS NOT NULL", task_id)),
            None,
        ),
        timeout=scaled(30),
        what=f"the run of task {task_id}",
    )
    return run


def _all_on(ha: HaInstance) -> None:
    ha.set_state(PUMP, True)
    ha.set_state(VALVE_1, True)
    ha.set_state(DURATION, 90)
    wait_state(ha, PUMP, "on")
    wait_state(ha, VALVE_1, "on")
    wait_state(ha, DURATION, "90.0")


def _state(ha: HaInstance, entity_id: str) -> str:
    state: str = ha.get_state(entity_id)["state"]
    return state


# ---------------------------------------------------------------------------------------------- /stop


def test_stop_puts_every_guarded_entity_safe_pauses_agents_denies_approvals_and_says_what_it_did(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir)
    _all_on(ha_reset)
    with farm_daemon(data_dir, ha_env, fake_telegram):
        approval_id, asked = ask_approval(
            fake_telegram, data_dir, MAIN_CHAT, "r-pump", {"entityId": PUMP, "value": "on"}
        )

        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        [reply] = wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        states = {e: _state(ha_reset, e) for e in (PUMP, VALVE_1, VALVE_2, DURATION)}
        paused = _paused(data_dir)
        [denied_told] = wait_told(fake_telegram, FIELD_CHAT, f"Approval {approval_id}")
        (approval,) = db_rows(data_dir, "SELECT * FROM approvals WHERE id = ?", approval_id)

        fake_telegram.user_message(MAIN_CHAT, "/status")
        [status] = wait_told(fake_telegram, MAIN_CHAT, "Farm status")
        run = _schedule_now(data_dir, "t-after-stop")
        press = fake_telegram.callback_query(MAIN_CHAT, asked.result["message_id"], f"fa:{approval_id}:y", user_id=ANA)
        pressed = press_answer(fake_telegram, press)

    assert states == {PUMP: "off", VALVE_1: "off", VALVE_2: "off", DURATION: "0.0"}
    text = reply.text or ""
    lines = text.splitlines()
    assert lines[0] == "EMERGENCY STOP by @ana: agents are paused and guarded devices are being kept safe."
    made = next(line for line in lines if line.startswith("Turned off / closed (3): "))
    for name in (f"Irrigation pump ({PUMP})", f"Field 1 valve ({VALVE_1})", f"Irrigation duration ({DURATION})"):
        assert name in made, (name, text)
    assert f"Already safe (1): Field 2 valve ({VALVE_2})." in lines
    assert f"Left as they are (the farm profile names no safe state for them): {PROGRAM}." in lines
    assert f"Pending approvals denied: {approval_id} (" in text
    assert "FAILED" not in text and "/resume" in lines[-1]
    assert reply.params["reply_markup"] == STOP_BUTTON
    assert paused is not None and paused.startswith("stopped by /stop (@ana, ")
    assert (approval["status"], approval["decided_by"]) == ("denied", "@ana")
    assert "denied by the emergency stop (@ana); nothing was done" in (denied_told.text or "")
    assert pressed.startswith("This approval was already denied by @ana")
    assert f"Agents are PAUSED: {paused}; /resume lets them run again" in (status.text or "")
    assert f"agent runs are paused ({paused}); nothing was run" in (run["detail"] or "")
    (line,) = _stops(data_dir)
    assert (line["group"], line["status"], line["by"], line["via"]) == ("farmhost", "success", "@ana", "/stop")
    assert sorted(line["params"]["madeSafe"]) == sorted([PUMP, VALVE_1, DURATION])
    assert line["params"]["alreadySafe"] == [VALVE_2] and line["params"]["approvalsDenied"] == [approval_id]
    assert line["params"]["noSafeState"] == [PROGRAM] and line["params"]["failed"] == {}


def test_stop_reaches_the_entities_a_rule_guards_by_service(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # No rule names an entity: they are guarded by service, so the stop finds them in HA's current states (every
    # switch and every light); the fan, which no rule covers, is left on.
    rules = [{"services": ["switch.turn_on"], "maxCallsPerHour": 4}, {"services": ["light.*"], "requireApproval": True}]
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": rules}}))
    for entity in (PUMP, VALVE_1, BARN_LIGHT, FAN):
        ha_reset.set_state(entity, True)
        wait_state(ha_reset, entity, "on")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/stop")
        [reply] = wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        states = {e: _state(ha_reset, e) for e in (PUMP, VALVE_1, VALVE_2, BARN_LIGHT, FAN)}

    assert states == {PUMP: "off", VALVE_1: "off", VALVE_2: "off", BARN_LIGHT: "off", FAN: "on"}
    made = next(line for line in (reply.text or "").splitlines() if line.startswith("Turned off / closed (3): "))
    for name in (f"Irrigation pump ({PUMP})", f"Field 1 valve ({VALVE_1})", f"Barn light ({BARN_LIGHT})"):
        assert name in made, (name, reply.text)
    assert FAN not in (reply.text or "")
    (line,) = _stops(data_dir)
    assert sorted(line["params"]["madeSafe"]) == sorted([PUMP, VALVE_1, BARN_LIGHT])
    assert line["params"]["alreadySafe"] == [VALVE_2] and line["params"]["failed"] == {}


def test_stop_from_another_chat_or_from_outside_the_main_senders_does_nothing(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir)
    _all_on(ha_reset)
    with farm_daemon(data_dir, ha_env, fake_telegram, FARMHOST_TELEGRAM_MAIN_SENDERS=str(ANA)):
        fake_telegram.user_message(FIELD_CHAT, "/stop")
        [refusal] = wait_told(fake_telegram, FIELD_CHAT, "/stop")
        fake_telegram.user_message(FIELD_CHAT, "/resume")
        [refused_resume] = wait_told(fake_telegram, FIELD_CHAT, "/resume")
        by_bea = fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=BEA, username="bea")
        bea_row = _update_row(data_dir, by_bea)
        in_field = press_answer(fake_telegram, fake_telegram.callback_query(FIELD_CHAT, 1, "stop:all"))
        pressed_by_bea = press_answer(
            fake_telegram, fake_telegram.callback_query(MAIN_CHAT, 1, "stop:all", user_id=BEA, username="bea")
        )
        states = {e: _state(ha_reset, e) for e in (PUMP, VALVE_1, DURATION)}
        paused = _paused(data_dir)

    assert refusal.text == "/stop works only in the farm's main chat."
    assert refused_resume.text == "/resume works only in the farm's main chat."
    assert bea_row["status"] == "ignored" and "FARMHOST_TELEGRAM_MAIN_SENDERS" in bea_row["detail"]
    assert in_field == "Only the farm's main chat can stop everything."
    assert pressed_by_bea == "Only members of the farm's main chat can decide this."
    assert states == {PUMP: "on", VALVE_1: "on", DURATION: "90.0"}
    assert paused is None and not _stops(data_dir)
    assert not sent_with(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")


def test_the_stop_everything_button_stops_and_a_forged_or_replayed_press_does_nothing(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir)
    _all_on(ha_reset)
    with farm_daemon(data_dir, ha_env, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/resume", user_id=ANA)  # not paused: it says so, and carries the button
        [resumed] = wait_told(fake_telegram, MAIN_CHAT, "Agents were not paused")
        press = fake_telegram.callback_query(MAIN_CHAT, resumed.result["message_id"], "stop:all", user_id=ANA)
        toast = press_answer(fake_telegram, press)
        [report] = wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP by @ana")
        wait_state(ha_reset, PUMP, "off")
        states = {e: _state(ha_reset, e) for e in (PUMP, VALVE_1, DURATION)}

        ha_reset.set_state(PUMP, True)  # switched on again by hand: only a real press may stop it again
        wait_state(ha_reset, PUMP, "on")
        fake_telegram.redeliver(press["update_id"])
        forged = [
            press_answer(
                fake_telegram,
                fake_telegram.callback_query(MAIN_CHAT, resumed.result["message_id"], data, user_id=ANA),
            )
            for data in ("stop:ALL", "stop:all:1", "stop", "stop:", " stop:all", "stop:all ")
        ]  # answered after the redelivered update: it was processed (dropped) by then
        pump_after = _state(ha_reset, PUMP)

    assert resumed.params["reply_markup"] == STOP_BUTTON and report.params["reply_markup"] == STOP_BUTTON
    assert toast == "Stopping everything now; the report follows in the chat."
    assert states == {PUMP: "off", VALVE_1: "off", DURATION: "0.0"}
    assert f"Irrigation pump ({PUMP})" in (report.text or "")
    assert forged == ["This button is not used any more."] * 6
    assert pump_after == "on"
    (line,) = _stops(data_dir)
    assert (line["by"], line["via"]) == ("@ana", "button")


def test_the_stop_survives_a_restart_and_resume_lifts_only_the_pause(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir)
    _all_on(ha_reset)
    with farm_daemon(data_dir, ha_env, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
    paused = _paused(data_dir)
    assert paused is not None and paused.startswith("stopped by /stop (@ana, ")
    doctor = farmhost("doctor", "--json", data_dir=data_dir)
    agents = next(c for c in json.loads(doctor.stdout) if c["part"] == "agents")
    assert (agents["state"], agents["detail"]) == ("warn", f"agent runs are paused: {paused}")
    assert "/resume" in agents["fix"]

    with farm_daemon(data_dir, ha_env, fake_telegram):
        run = _schedule_now(data_dir, "t-after-restart")
        asked = fake_telegram.user_message(MAIN_CHAT, "turn the irrigation pump on for an hour")
        [told_paused] = wait_told(fake_telegram, MAIN_CHAT, "Agents are paused")
        asked_row = _update_row(data_dir, asked)
        fake_telegram.user_message(MAIN_CHAT, "/status")
        [status] = wait_told(fake_telegram, MAIN_CHAT, "Farm status")
        fake_telegram.user_message(MAIN_CHAT, "/resume", user_id=ANA)
        [resumed] = wait_told(fake_telegram, MAIN_CHAT, "Agents resumed")
        after_resume = _paused(data_dir)
        states = {e: _state(ha_reset, e) for e in (PUMP, VALVE_1, DURATION)}

    assert f"agent runs are paused ({paused}); nothing was run" in (run["detail"] or "")
    assert f"Agents are PAUSED: {paused}" in (status.text or "")
    # Answered, and finished: it is not kept to run after /resume or at the next start.
    assert told_paused.text == (
        f"Agents are paused ({paused}): nothing more is done for this message. Send it again after /resume."
    )
    assert asked_row["status"] == "failed" and json.loads(asked_row["detail"])["note"] == "paused"
    assert resumed.text == (
        f"Agents resumed by @ana (they were {paused}). Nothing was turned back on: "
        "devices stay as they are until someone switches them."
    )
    assert after_resume is None
    assert states == {PUMP: "off", VALVE_1: "off", DURATION: "0.0"}  # /resume turns nothing back on
    (line,) = [line for line in audit(data_dir) if line["action"] == "emergency_resume"]
    assert (line["group"], line["by"], line["params"]) == ("farmhost", "@ana", {"wasPaused": paused})


def test_a_safe_call_home_assistant_refuses_is_reported_by_name_and_the_others_are_still_made_safe(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    rules = [
        {"entities": [PUMP], "requireApproval": True},
        {"entities": [DURATION], "safeState": -5},  # below the number's min 0: HA refuses set_value
        {"entities": [PROGRAM], "requireApproval": True, "safeState": "none"},
    ]
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": rules}}))
    _all_on(ha_reset)
    ha_reset.set_state(PROGRAM, "bloom")
    wait_state(ha_reset, PROGRAM, "bloom")
    with farm_daemon(data_dir, ha_env, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        [reply] = wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        states = {e: _state(ha_reset, e) for e in (PUMP, DURATION, PROGRAM)}
        paused = _paused(data_dir)

    assert states == {PUMP: "off", DURATION: "90.0", PROGRAM: "none"}
    lines = (reply.text or "").splitlines()
    made = next(line for line in lines if line.startswith("Turned off / closed (2): "))
    assert f"Irrigation pump ({PUMP})" in made and f"Fertigation program ({PROGRAM})" in made
    assert "FAILED (1), check these by hand now:" in lines
    failed = next(line for line in lines if line.startswith(f"• Irrigation duration ({DURATION}): "))
    assert failed.endswith(
        ": Home Assistant still reports '90.0' (number.set_value failed: Home Assistant refused call_service: Validation error: Value "
        "-5.0 for number.irrigation_duration is outside valid range 0.0 - 240.0 (service_validation_error))"
    ), failed
    assert paused is not None  # the pause does not depend on Home Assistant
    (line,) = _stops(data_dir)
    assert (line["status"], line["errorCode"]) == ("error", "upstream_error")
    assert list(line["params"]["failed"]) == [DURATION]


def test_stop_without_home_assistant_still_pauses_agents_and_says_nothing_was_switched(
    data_dir: Path, fake_telegram: FakeTelegram
) -> None:
    _profile(data_dir)
    with farm_daemon(data_dir, {}, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        [reply] = wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        paused = _paused(data_dir)

    assert "Nothing was switched: Home Assistant is not configured (HA_URL / HA_TOKEN)." in (reply.text or "")
    assert paused is not None and paused.startswith("stopped by /stop (@ana, ")
    (line,) = _stops(data_dir)
    assert (line["errorCode"], line["params"]["problem"]) == (
        "upstream_error", "Home Assistant is not configured (HA_URL / HA_TOKEN)"
    )  # fmt: skip


def test_while_stopped_a_control_request_is_refused_and_only_the_safe_direction_runs(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # A hostile agent may ignore SIGTERM for STOP_GRACE, or have written its request just before: after /stop the
    # host itself refuses what would switch a device on, and every group may still turn things to their safe state.
    _profile(data_dir)
    with farm_daemon(data_dir, ha_env, fake_telegram):
        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        paused = _paused(data_dir)

        def act(rid: str, params: dict[str, Any], folder: str = "main") -> dict[str, Any]:
            request = {"type": "farm_action", "action": "ha_set_entity", "requestId": rid, "params": params}
            drop(data_dir, folder, "actions", request)
            return wait_result(data_dir, folder, rid, timeout=20)

        valve_on = act("r-valve-on", {"entityId": VALVE_1, "value": "on"})
        duration = act("r-duration", {"entityId": DURATION, "value": 60}, folder="field")
        valve_off = act("r-valve-off", {"entityId": VALVE_1, "value": "off"}, folder="field")
        states = {e: _state(ha_reset, e) for e in (VALVE_1, DURATION)}

    sentence = f"agents are paused ({paused}): until /resume only turning devices to their safe state is allowed"
    refused(valve_on, "not_allowed", sentence)
    refused(duration, "not_allowed", sentence)
    assert valve_off["status"] == "success", valve_off
    assert states == {VALVE_1: "off", DURATION: "0.0"}
    assert [line["errorCode"] for line in audit(data_dir, "r-valve-on")] == ["not_allowed"]


def test_while_stopped_an_agents_change_that_lands_after_the_stop_is_undone(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # A call an agent sent just before /stop (or an HA script it started) may reach Home Assistant after the stop
    # made the valve safe. The valve's rule asks only for a rate, which this change does not break: it would stand,
    # with the farm "stopped". Until /resume every agents' change of a guarded entity away from its safe state is
    # held, whatever its rule asks.
    _profile(data_dir)
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=scaled(20), what="the live view")
        fake_telegram.user_message(MAIN_CHAT, "/stop", user_id=ANA)
        wait_told(fake_telegram, MAIN_CHAT, "EMERGENCY STOP")
        paused = _paused(data_dir)
        # farmhost's own HA user: what an agent's call is made as
        http_json(
            "POST", ha_reset.url + "/api/services/switch/turn_on", ha_reset.farmhost_token, {"entity_id": VALVE_1}
        )
        line = wait_for(
            lambda: next((a for a in audit(data_dir) if a["action"] == "violation"), None),
            timeout=scaled(20),
            what="the violation line of the valve",
            seen=lambda: audit(data_dir)[-3:],
        )
        wait_state(ha_reset, VALVE_1, "off")
        told = wait_told(fake_telegram, MAIN_CHAT, "farmhost undid a change")
        counted = db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", VALVE_1)

    assert (line["params"]["entity_id"], line["params"]["rule"], line["undoneTo"]) == (VALVE_1, "paused", "off")
    assert paused is not None and paused in line["reason"], line
    assert "until /resume" in (told[0].text or "")
    assert not counted  # a held change is not counted against the rate
