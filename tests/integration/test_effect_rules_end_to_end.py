"""Issue 32: the rules hold on what happens in Home Assistant, whatever route an agent's call took.

The real daemon, the real Home Assistant and the fake Bot API. Each attack of the issue is made by an agent
(a farm action dropped into a group's queue, from main and from a non-main group the profile opens to
`ha_call_service`): a scene applying the pump, a scene created then turned on, the relay helper behind the
pump's template switch, a valve's relay toggled past its rate, the raw number behind a ranged one. Each is
undone at once (a short blip), audited as a `violation` with its context and rule, told to the main chat and
raised as an alert. A person's change (the owner's token) is never undone, and the automatic off still applies
to it; a template.reload loop does not re-time the off; the live view survives an HA restart and a dropped
WebSocket (a change made meanwhile is caught at the resync).
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import assert_off_in_time, audit, db_rows, farm_daemon, sent_with, wait_state
from farmhost_testing import MAIN_JID, Daemon, drop, hold_for, refused, scaled, wait_for, wait_result
from ha_fixture import HaInstance, WsSession
from tcp_relay import TcpRelay
from telegram_stub import FakeTelegram

from farmhost.localha.client import http_json

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
PUMP_RELAY = "input_boolean.pump_relay"
VALVE = "switch.field_1_valve"
VALVE_RELAY = "input_boolean.field_1_valve_relay"
DURATION = "number.irrigation_duration"
DURATION_RAW = "input_number.irrigation_duration_raw"
FAN = "fan.greenhouse_fan"
LIGHT = "light.barn_light"
LIGHT_RELAY = "input_boolean.barn_light_relay"
GROUPS = {"ha_call_service": ["main", "field"], "ha_set_entity": ["main", "field"]}
# What these attacks need opened once the closed service surface lands (issue 32, point 4); accepted today.
ALLOW = ["scene.*", "input_boolean.*", "input_number.*", "template.reload"]
PUMP_APPROVAL = {"entities": [PUMP], "requireApproval": True}


def _profile(data_dir: Path, rules: list[dict[str, Any]]) -> None:
    policy = {"actionGroups": GROUPS, "allowServices": ALLOW, "rules": rules}
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))


def _call(data_dir: Path, rid: str, service: str, data: dict[str, Any], *, folder: str = "main") -> dict[str, Any]:
    """An agent's ha_call_service, dropped the way the in-sandbox client writes it; its result."""
    domain, name = service.split(".", 1)
    params = {"domain": domain, "service": name, "data": data}
    drop(
        data_dir,
        folder,
        "actions",
        {"type": "farm_action", "action": "ha_call_service", "requestId": rid, "params": params},
    )
    return wait_result(data_dir, folder, rid, timeout=scaled(20))


def _following(daemon: Daemon) -> None:
    """The live view has synced (an agents' change before it is judged too, but against no previous state)."""
    wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=scaled(20), what="the live view")


def _violations(data_dir: Path, entity_id: str) -> list[dict[str, Any]]:
    return [a for a in audit(data_dir) if a["action"] == "violation" and a["params"]["entity_id"] == entity_id]


def _wait_violations(data_dir: Path, entity_id: str, count: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = wait_for(
        lambda: v if len(v := _violations(data_dir, entity_id)) >= count else None,
        timeout=scaled(20),
        what=f"{count} violation line(s) of {entity_id}",
        seen=lambda: audit(data_dir)[-3:],
    )
    return found


def _told(tg: FakeTelegram, needle: str, count: int = 1) -> list[str]:
    told: list[str] = wait_for(
        lambda: t if len(t := sent_with(tg, MAIN_CHAT, needle)) >= count else None,
        timeout=scaled(20),
        what=f"{count} main-chat message(s) with {needle!r}",
        seen=lambda: tg.sent_texts(MAIN_CHAT),
    )
    return told


def _alerts(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "farm-state" / "alerts.json"
    active: list[dict[str, Any]] = json.loads(path.read_text())["active"] if path.exists() else []
    return active


def _assert_undone(line: dict[str, Any], ha: HaInstance, *, rule: str, back_to: object) -> None:
    """The audit line names the change, its context (farmhost's HA user) and the rule; the blip was short."""
    assert line["group"] == "farmhost" and line["status"] == "success", line
    assert line["params"]["rule"] == rule and line["undoneTo"] == back_to, line
    assert line["context"]["id"] and line["context"]["userId"], line  # the change's context, with its user
    assert line["context"]["userId"] == _farmhost_user(ha), line  # an agent's call is made as farmhost's user
    # Event to undo answered: the goal is p99 <= 1 s on an idle machine (bench/safety_undo.py measures it).
    assert line["durationMs"] <= scaled(2) * 1000, line


def _farmhost_user(ha: HaInstance) -> str:
    with WsSession(ha.ws_url, ha.farmhost_token) as ws:
        user_id: str = ws.command("auth/current_user")["result"]["id"]
    return user_id


# ---------------------------------------------------------------------------------------------- the attacks


@pytest.mark.parametrize("folder", ["main", "field"])
def test_scene_apply_of_the_guarded_pump_is_undone_audited_told_and_alerted(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [PUMP_APPROVAL])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        _call(data_dir, "r-scene-apply", "scene.apply", {"entities": {PUMP: "on"}}, folder=folder)
        (line,) = _wait_violations(data_dir, PUMP)
        wait_state(ha_reset, PUMP, "off")
        (told,) = _told(fake_telegram, "farmhost undid a change of Irrigation pump")
        # Told once as a critical alert (issue 34): Acknowledge and Snooze, Stop everything as a second row.
        assert told.startswith("CRITICAL: farmhost undid a change of Irrigation pump"), told
        (call,) = [c for c in fake_telegram.sent(MAIN_CHAT) if c.text == told]
        rows = call.params["reply_markup"]["inline_keyboard"]
        assert [[b["text"] for b in row] for row in rows] == [["Acknowledge", "Snooze 1 h"], ["Stop everything"]]
        alert = wait_for(
            lambda: next((a for a in _alerts(data_dir) if a["rule"] == "violation"), None),
            timeout=scaled(10),
            what="the violation alert",
        )

    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")
    assert (line["params"]["from"], line["params"]["to"]) == ("off", "on")
    assert "needs an approval in the main chat" in told and "set it back to off within" in told
    assert alert["entityId"] == PUMP and alert["severity"] == "critical"
    assert ha_reset.get_state(PUMP_RELAY)["state"] == "off"


def test_scene_create_then_turn_on_is_undone(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [PUMP_APPROVAL])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        made = _call(data_dir, "r-scene-create", "scene.create", {"scene_id": "quiet", "entities": {PUMP: "on"}})
        try:
            assert made["status"] == "success", made
            assert ha_reset.get_state(PUMP)["state"] == "off"  # creating it changed nothing
            _call(data_dir, "r-scene-on", "scene.turn_on", {"entity_id": "scene.quiet"}, folder="field")
            (line,) = _wait_violations(data_dir, PUMP)
            wait_state(ha_reset, PUMP, "off")
            _told(fake_telegram, "farmhost undid a change of Irrigation pump")
        finally:  # the session's HA is shared: a scene left behind is exposed to Assist in later tests
            ha_reset.call_service("scene", "delete", {"entity_id": "scene.quiet"})

    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")


@pytest.mark.parametrize("folder", ["main", "field"])
def test_the_relay_helper_behind_the_pump_cannot_turn_it_on(
    folder: str, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [PUMP_APPROVAL])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        _call(data_dir, "r-relay", "input_boolean.turn_on", {"entity_id": PUMP_RELAY}, folder=folder)
        (line,) = _wait_violations(data_dir, PUMP)
        wait_state(ha_reset, PUMP, "off")
        wait_state(ha_reset, PUMP_RELAY, "off")
        _told(fake_telegram, "farmhost undid a change of Irrigation pump")

    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")


def test_eight_relay_toggles_against_four_an_hour_count_four_effects_and_undo_the_rest(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [VALVE], "maxCallsPerHour": 4}])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        for n in range(8):
            _call(data_dir, f"r-on-{n}", "input_boolean.turn_on", {"entity_id": VALVE_RELAY})
            _call(data_dir, f"r-off-{n}", "input_boolean.turn_off", {"entity_id": VALVE_RELAY})
        lines = _wait_violations(data_dir, VALVE, 4)
        wait_state(ha_reset, VALVE, "off")
        told = _told(fake_telegram, "Field 1 valve", 4)

    assert len(lines) == 4 and {line["params"]["rule"] for line in lines} == {"maxCallsPerHour"}
    for line in lines:
        _assert_undone(line, ha_reset, rule="maxCallsPerHour", back_to="off")
    # four "on" effects counted, the offs (the safe direction) and the undone ones not at all
    assert len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", VALVE)) == 4
    assert all("the farm profile allows 4" in text for text in told)


def test_a_ranged_number_set_through_its_raw_helper_or_a_scene_is_set_back(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [DURATION], "valueRange": [0, 120]}])
    before = float(ha_reset.get_state(DURATION)["state"])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        _call(data_dir, "r-raw", "input_number.set_value", {"entity_id": DURATION_RAW, "value": 240}, folder="field")
        (raw,) = _wait_violations(data_dir, DURATION)
        wait_for(
            lambda: float(ha_reset.get_state(DURATION)["state"]) == before,
            timeout=scaled(10),
            what="set back",
            seen=lambda: (ha_reset.get_state(DURATION)["state"], audit(data_dir)[-2:]),
        )
        _call(data_dir, "r-scene-number", "scene.apply", {"entities": {DURATION: "230"}})
        scene = _wait_violations(data_dir, DURATION, 2)[1]
        wait_for(
            lambda: float(ha_reset.get_state(DURATION)["state"]) == before,
            timeout=scaled(10),
            what="set back",
            seen=lambda: (ha_reset.get_state(DURATION)["state"], audit(data_dir)[-2:]),
        )
        _told(fake_telegram, "outside the farm profile's range 0..120", 2)

    _assert_undone(raw, ha_reset, rule="valueRange", back_to=before)
    _assert_undone(scene, ha_reset, rule="valueRange", back_to=before)
    assert float(raw["params"]["to"]) == 240 and float(scene["params"]["to"]) == 230
    assert float(ha_reset.get_state(DURATION_RAW)["state"]) == before


def test_a_rule_written_by_service_holds_its_effect_whatever_the_call(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # The light going on is light.turn_on's effect: a toggle asks for approval, the relay behind it is undone.
    _profile(data_dir, [{"services": ["light.turn_on"], "requireApproval": True}])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        toggled = _call(data_dir, "r-light-toggle", "light.toggle", {"entity_id": LIGHT})
        after_toggle = ha_reset.get_state(LIGHT)["state"]
        _call(data_dir, "r-light-relay", "input_boolean.turn_on", {"entity_id": LIGHT_RELAY})
        (line,) = _wait_violations(data_dir, LIGHT)
        wait_state(ha_reset, LIGHT, "off")
        wait_state(ha_reset, LIGHT_RELAY, "off")
        _told(fake_telegram, "farmhost undid a change of Barn light")

    refused(toggled, "pending_approval", "needs an approval in the farm's main chat")
    assert after_toggle == "off"
    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")


def test_a_range_written_by_service_holds_the_number_set_through_its_raw_helper(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # number.irrigation_duration taking a value is number.set_value's effect, whichever service the agent called.
    _profile(data_dir, [{"services": ["number.set_value"], "valueRange": [0, 100]}])
    before = float(ha_reset.get_state(DURATION)["state"])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        _call(data_dir, "r-raw-110", "input_number.set_value", {"entity_id": DURATION_RAW, "value": 110})
        (line,) = _wait_violations(data_dir, DURATION)
        wait_for(
            lambda: float(ha_reset.get_state(DURATION)["state"]) == before,
            timeout=scaled(10),
            what="set back",
            seen=lambda: (ha_reset.get_state(DURATION)["state"], audit(data_dir)[-2:]),
        )
        _told(fake_telegram, "outside the farm profile's range 0..100")

    _assert_undone(line, ha_reset, rule="valueRange", back_to=before)
    assert float(line["params"]["to"]) == 110


# ---------------------------------------------------------------------------------------------- people, time


def test_a_persons_change_is_never_undone_but_max_on_seconds_still_applies(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # Nothing has to happen inside the on-period, and how long it held is read from HA's history: a limit past
    # the undo's latency (an undo, wrongly made, ends it sooner) and the auto-off's next look (2 s).
    limit = 3
    _profile(data_dir, [{"entities": [PUMP], "requireApproval": True, "maxOnSeconds": limit}])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        since = datetime.now(UTC)
        ha_reset.call_service("switch", "turn_on", {"entity_id": PUMP})  # the owner: a person at the farm
        wait_state(ha_reset, PUMP, "off", timeout=limit + scaled(15))
        (told,) = _told(fake_telegram, "turned off Irrigation pump")
        assert_off_in_time(ha_reset, data_dir, PUMP, since, limit)

    assert not _violations(data_dir, PUMP)
    assert f"the farm profile allows {limit} s" in told


def test_max_on_seconds_is_not_re_timed_by_a_template_reload_loop(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        # The on-period must hold several reloads: sized by one reload's round trip, timed now (the fan still off).
        _following(daemon)
        started = time.monotonic()
        _call(data_dir, "r-reload-probe", "template.reload", {})
        limit = math.ceil(hold_for(time.monotonic() - started, least=3))
        _profile(data_dir, [{"entities": [FAN], "maxOnSeconds": limit}])  # read at the fan's first look
        # A deadline past the limit, not a hold: an off re-timed by the reloads keeps the fan on until the loop
        # stops (at `keep_on`), and then for the limit again, far past `late`.
        late = limit + scaled(6)
        keep_on = late + limit
        since = datetime.now(UTC)
        started = time.monotonic()
        ha_reset.call_service("fan", "turn_on", {"entity_id": FAN})
        reloads = 0
        while ha_reset.get_state(FAN)["state"] == "on" and time.monotonic() - started < keep_on:
            _call(data_dir, f"r-reload-{reloads}", "template.reload", {})  # an agent re-stamping last_changed
            reloads += 1
        held = time.monotonic() - started
        (told,) = _told(fake_telegram, "turned off Greenhouse fan")
        assert_off_in_time(ha_reset, data_dir, FAN, since, limit)  # one row: the reloads did not re-time it

    assert ha_reset.get_state(FAN)["state"] == "off"
    assert reloads >= 2, "the reloads did not run while the fan was on"
    assert held <= late, f"on for {held:.1f} s against a limit of {limit} s"
    on_for = re.search(r"had been on for (\d+) s", told)
    assert on_for is not None and limit <= int(on_for.group(1)) <= held + 1, told  # the true on-time
    assert not _violations(data_dir, FAN)


def test_a_change_made_while_the_websocket_was_down_is_caught_at_the_resync(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [PUMP_APPROVAL])
    with TcpRelay(ha_reset.port) as relay:
        env = {**ha_env, "HA_URL": relay.url}
        with farm_daemon(data_dir, env, fake_telegram) as daemon:
            _following(daemon)
            relay.cut()
            wait_for(lambda: "event stream is lost" in daemon.log(), timeout=scaled(20), what="the loss noticed")
            # farmhost's own HA user (what an agent's call is made as), straight to HA while farmhost is blind
            http_json(
                "POST", ha_reset.url + "/api/services/input_boolean/turn_on", ha_reset.farmhost_token,
                {"entity_id": PUMP_RELAY},
            )  # fmt: skip
            wait_state(ha_reset, PUMP, "on")
            relay.heal()
            (line,) = _wait_violations(data_dir, PUMP)
            assert line["status"] == "success", line
            wait_state(ha_reset, PUMP, "off")
            log = daemon.log()

    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")
    assert line["resync"] is True
    assert log.count("event stream is lost") == 1 and log.count("event stream is back") == 1, log


def test_assist_through_a_service_call_cannot_turn_the_guarded_pump_on(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    policy = {"actionGroups": GROUPS, "allowServices": [*ALLOW, "conversation.*"], "rules": [PUMP_APPROVAL]}
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        answer = _call(
            data_dir, "r-assist", "conversation.process", {"text": "turn on the irrigation pump"}, folder="field"
        )

    # conversation.* is closed whatever the profile lists (only ha_assist reaches Assist), so Assist never ran.
    assert answer["status"] == "error" and answer["errorCode"] == "not_allowed", answer
    assert "ha_assist" in answer["error"]
    assert ha_reset.get_state(PUMP)["state"] == "off"
    assert not [line for line in audit(data_dir) if line["action"] == "violation"]


def test_across_an_agents_ha_restart_the_live_view_still_undoes_and_a_fan_is_off_in_time(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # One Home Assistant restart for both (a restart is the longest thing this file waits for): the live view is
    # back and undoes again, and the fan's automatic off is not lost across it.
    limit = max(20, round(scaled(20)))  # longer than the restart, so the restart happens inside the on-period
    policy = {
        "actionGroups": {**GROUPS, "ha_restart": ["main"]},
        "allowServices": ALLOW,
        "rules": [PUMP_APPROVAL, {"entities": [FAN], "maxOnSeconds": limit}],
    }
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        started = time.monotonic()
        ha_reset.call_service("fan", "turn_on", {"entity_id": FAN})
        drop(data_dir, "main", "actions", {"type": "farm_action", "action": "ha_restart", "requestId": "r-restart"})
        assert wait_result(data_dir, "main", "r-restart", timeout=scaled(160))["status"] == "success"
        wait_for(lambda: "event stream is back" in daemon.log(), timeout=scaled(30), what="the live view back")
        _call(data_dir, "r-after-restart", "input_boolean.turn_on", {"entity_id": PUMP_RELAY})
        (line,) = _wait_violations(data_dir, PUMP)
        wait_state(ha_reset, PUMP, "off")
        # The simulated relay starts off after a restart (`initial: false`); a relay that kept its state would be
        # turned off by the limit, counted from before the restart.
        if ha_reset.get_state(FAN)["state"] == "on":
            wait_state(ha_reset, FAN, "off", timeout=limit + scaled(10))
        held = time.monotonic() - started
        log = daemon.log()

    _assert_undone(line, ha_reset, rule="requireApproval", back_to="off")
    assert log.count("event stream is lost") == 1 and log.count("event stream is back") == 1, log
    assert ha_reset.get_state(FAN)["state"] == "off"
    assert held <= limit + scaled(10), f"on for {held:.1f} s against a limit of {limit} s"
    assert not _violations(data_dir, FAN)
