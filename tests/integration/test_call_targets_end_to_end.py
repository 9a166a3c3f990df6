"""How a control action names what it acts on: the gate judges the entities Home Assistant will act on, before it acts.

The real daemon, the real Home Assistant test instance and the fake Bot API. Home Assistant resolves some names to
other entities on its own side (a `group.*` entity to its members, a group helper to the entities it drives, `all`,
areas and labels): a call that reaches a guarded entity through one of them is held by that entity's rule before
anything is switched, never run first and undone after.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import approval_asked, audit, farm_daemon, press_approval, wait_state
from farmhost_testing import drop, refused, wait_result
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

PUMP = "switch.irrigation_pump"
VALVE_1 = "switch.field_1_valve"
DURATION = "number.irrigation_duration"
PUMP_RELAY = "input_boolean.pump_relay"
OPEN = {"ha_call_service": ["main", "field"], "ha_set_entity": ["main", "field"]}


def _profile(data_dir: Path, rules: list[dict[str, Any]], **policy: Any) -> None:
    document = {"policy": {"actionGroups": OPEN, "rules": rules} | policy}
    (data_dir / "farm-profile.json").write_text(json.dumps(document))


def _act(data_dir: Path, rid: str, params: dict[str, Any], action: str = "ha_call_service") -> dict[str, Any]:
    drop(data_dir, "field", "actions", {"type": "farm_action", "action": action, "requestId": rid, "params": params})
    return wait_result(data_dir, "field", rid, timeout=20)


@pytest.fixture
def groups(ha_reset: HaInstance) -> Iterator[dict[str, str]]:
    """`group.*` entities as a farm's configuration.yaml `group:` makes them: the pump and a valve, nested, a number."""
    made = {
        "water": ("group.attack_targets_water", [PUMP, VALVE_1]),
        "outer": ("group.attack_targets_outer", ["group.attack_targets_water", "light.barn_light"]),
        "duration": ("group.attack_targets_duration", [DURATION]),
    }
    for entity_id, members in made.values():
        ha_reset.write_state(entity_id, "off", {"entity_id": members, "friendly_name": entity_id})
    try:
        yield {key: entity_id for key, (entity_id, _) in made.items()}
    finally:
        for entity_id, _ in made.values():
            ha_reset.api("DELETE", f"/api/states/{entity_id}")


def _violations(data_dir: Path) -> list[dict[str, Any]]:
    return [line for line in audit(data_dir) if line["action"] == "violation"]


def test_a_call_through_a_group_is_judged_on_its_members_before_anything_is_switched(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str], groups: dict[str, str]
) -> None:
    _profile(
        data_dir, [{"entities": [PUMP], "requireApproval": True}, {"entities": [DURATION], "valueRange": [0, 120]}]
    )
    duration = ha_reset.get_state(DURATION)["state"]
    with farm_daemon(data_dir, ha_env, fake_telegram):
        # Home Assistant turns on the group's members: the pump among them, which asks for an approval first
        on = _act(
            data_dir, "r-on", {"domain": "switch", "service": "turn_on", "target": {"entity_id": groups["water"]}}
        )
        pump_before_approval = ha_reset.get_state(PUMP)["state"]
        nested = _act(data_dir, "r-nested", {"domain": "switch", "service": "turn_on", "data": {"entity_id": [groups["outer"]]}})  # fmt: skip
        past_range = _act(data_dir, "r-range", {"domain": "number", "service": "set_value", "target": {"entity_id": groups["duration"]}, "data": {"value": 230}})  # fmt: skip
        asked = approval_asked(fake_telegram, on["result"]["approvalId"])
        assert press_approval(fake_telegram, asked, "y") == "Approved: running it now."
        wait_state(ha_reset, PUMP, "on")
        wait_state(ha_reset, VALVE_1, "on")
        # the safe direction through the same nested groups is never held
        off = _act(data_dir, "r-off", {"domain": "switch", "service": "turn_off", "target": {"entity_id": groups["outer"]}})  # fmt: skip

    refused(on, "pending_approval")
    assert pump_before_approval == "off"
    assert PUMP in (asked.text or "")  # the approvers see what the call reaches, not only the group's name
    refused(nested, "pending_approval")
    assert nested["result"]["approvalId"] == on["result"]["approvalId"]  # the same effect: the same approval
    refused(past_range, "not_allowed", DURATION, "230")
    assert ha_reset.get_state(DURATION)["state"] == duration
    assert off["status"] == "success", off
    assert ha_reset.get_state(PUMP)["state"] == "off" and ha_reset.get_state(VALVE_1)["state"] == "off"
    assert not _violations(data_dir)  # nothing was switched that had to be undone


@pytest.fixture
def relay_scene(ha_reset: HaInstance) -> Iterator[str]:
    """A scene that switches the pump's relay on, as a farmer makes one (HA exposes scenes to Assist by default)."""
    ha_reset.call_service("scene", "create", {"scene_id": "attack_targets_start", "entities": {PUMP_RELAY: "on"}})
    try:
        yield "scene.attack_targets_start"
    finally:  # the session's HA is shared: a scene left behind is exposed to Assist in later tests
        ha_reset.call_service("scene", "delete", {"entity_id": "scene.attack_targets_start"})


def test_assist_is_held_to_the_rules_of_what_an_exposed_scene_reaches(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str], relay_scene: str
) -> None:
    # the relay is not exposed to Assist; the scene that switches it is
    _profile(data_dir, [{"entities": [PUMP_RELAY], "requireApproval": True}], actionGroups={"ha_assist": ["field"]})
    with farm_daemon(data_dir, ha_env, fake_telegram):
        answer = _act(data_dir, "r-assist", {"text": "activate attack_targets_start"}, action="ha_assist")

    refused(answer, "not_allowed", PUMP_RELAY, "in a scene or group exposed to it")
    assert ha_reset.get_state(PUMP_RELAY)["state"] == "off"
    assert not _violations(data_dir)


HUGE = 10**400  # a JSON integer no float holds


@pytest.mark.parametrize("ruled", [False, True], ids=["no rule", "under a range"])
def test_a_number_no_float_holds_is_refused_as_invalid_not_an_internal_error(
    ruled: bool, data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": [DURATION], "valueRange": [0, 120]}] if ruled else [])
    duration = ha_reset.get_state(DURATION)["state"]
    with farm_daemon(data_dir, ha_env, fake_telegram):
        by_set = _act(data_dir, "r-set", {"entityId": DURATION, "value": HUGE}, action="ha_set_entity")
        by_text = _act(data_dir, "r-text", {"entityId": DURATION, "value": "9" * 400}, action="ha_set_entity")
        by_call = _act(data_dir, "r-call", {"domain": "number", "service": "set_value", "target": {"entity_id": DURATION}, "data": {"value": HUGE}})  # fmt: skip

    refused(by_set, "not_allowed" if ruled else "invalid_request", DURATION)
    refused(by_text, "not_allowed" if ruled else "invalid_request", DURATION)
    refused(by_call, "not_allowed" if ruled else "invalid_request", DURATION if ruled else "data.value")
    assert ha_reset.get_state(DURATION)["state"] == duration
