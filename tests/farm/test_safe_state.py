"""The safe state of a guarded entity (farm/control/safe_state.py): by domain, by range, by the rule's safeState."""

from __future__ import annotations

import json
from typing import Any

import pytest

from farmhost.farm.control.effects import guarded
from farmhost.farm.control.policy import ProfileInvalid, parse_profile
from farmhost.farm.control.rules import ActuatorRule
from farmhost.farm.control.safe_state import is_on, is_safe_state, safe_target


def parsed(*entries: dict[str, Any]) -> tuple[ActuatorRule, ...]:
    return parse_profile(json.dumps({"policy": {"rules": list(entries)}})).rules


@pytest.mark.parametrize(
    ("entity", "state", "service"),
    [
        ("switch.irrigation_pump", "off", "turn_off"),
        ("light.barn_light", "off", "turn_off"),
        ("input_boolean.pump_relay", "off", "turn_off"),
        ("valve.field_1", "closed", "close_valve"),
        ("cover.greenhouse_vent", "closed", "close_cover"),
        ("lock.gate", "locked", "lock"),
    ],
)
def test_each_domain_has_its_own_safe_state(entity: str, state: str, service: str) -> None:
    rules = parsed({"entities": [entity], "requireApproval": True})
    target = safe_target(entity, rules)
    assert target is not None and (target.state, target.service, target.data) == (state, service, {})
    assert is_safe_state(entity, state.upper(), rules)
    assert not is_safe_state(entity, "on", rules)


def test_a_number_is_safe_at_the_low_end_of_its_range_else_its_min() -> None:
    rules = parsed(
        {"entities": ["number.irrigation_duration"], "valueRange": [5, 120]},
        {"entities": ["number.*"], "valueRange": [0, 100]},
    )
    target = safe_target("number.irrigation_duration", rules)
    assert target is not None and target.state == 5.0 and target.data == {"value": 5.0}
    assert is_safe_state("number.irrigation_duration", "5.0", rules)
    assert not is_safe_state("number.irrigation_duration", "6", rules)
    unranged = parsed({"entities": ["input_number.raw"], "maxCallsPerHour": 4})
    assert safe_target("input_number.raw", unranged, {"min": 2}) is not None
    assert safe_target("input_number.raw", unranged, {}) is None


def test_a_rule_names_another_safe_state_and_selects_have_none_without_it() -> None:
    rules = parsed(
        {"entities": ["switch.frost_heater"], "safeState": "on"},
        {"entities": ["select.mode"], "requireApproval": True},
        {"entities": ["select.fan_mode"], "safeState": "low"},
    )
    heater = safe_target("switch.frost_heater", rules)
    assert heater is not None and (heater.state, heater.service) == ("on", "turn_on")
    assert safe_target("select.mode", rules) is None
    fan = safe_target("select.fan_mode", rules)
    assert fan is not None and fan.data == {"option": "low"}
    assert guarded(rules, ["switch.frost_heater", "switch.other", "select.mode"]) == [
        "select.mode",
        "switch.frost_heater",
    ]
    by_service = parsed({"services": ["light.turn_on"], "requireApproval": True})
    assert guarded(by_service, ["light.barn", "switch.other", "input_boolean.barn_relay"]) == ["light.barn"]


def test_safe_state_needs_entities() -> None:
    with pytest.raises(ProfileInvalid, match="safeState needs entities"):
        parsed({"services": ["switch.turn_on"], "safeState": "off"})


@pytest.mark.parametrize(
    ("entity", "state", "on"),
    [
        ("switch.p", "on", True),
        ("switch.p", "off", False),
        ("valve.v", "opening", True),
        ("switch.p", "unavailable", None),
    ],
)
def test_on_states_by_domain(entity: str, state: str, on: bool | None) -> None:
    assert is_on(entity, state) is on
