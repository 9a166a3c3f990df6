"""Actuator rules (`policy.rules`): parsed strictly, what they cover, the pure checks, and the approval buttons' data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from farmhost.errors import NotAllowed
from farmhost.farm.control import actuator_gate as gate
from farmhost.farm.control import effects, rules
from farmhost.farm.control.approval_requests import callback_data, parse_callback
from farmhost.farm.control.policy import ProfileInvalid, parse_profile
from farmhost.farm.control.rules import ActuatorRule, ControlCall
from farmhost.protocol.params import HaCallServiceParams, HaSetEntityParams

PUMP = "switch.irrigation_pump"


def parsed(*entries: dict[str, Any]) -> tuple[ActuatorRule, ...]:
    return parse_profile(json.dumps({"policy": {"rules": list(entries)}})).rules


def problem(*entries: dict[str, Any]) -> str:
    with pytest.raises(ProfileInvalid) as caught:
        parsed(*entries)
    return str(caught.value)


# parsing -------------------------------------------------------------------------------------------------


def test_the_documented_rules_parse() -> None:
    found = parsed(
        {"entities": [PUMP], "maxOnSeconds": 1800, "requireApproval": {"approvers": [123456789], "expiresMinutes": 10}},
        {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 6, "minSecondsBetween": 30},
        {"entities": ["number.irrigation_duration"], "valueRange": [0, 120]},
        {"services": ["switch.turn_on"], "requireApproval": True},
        {"actions": ["ha_restart"], "requireApproval": True},
    )
    assert len(found) == 5
    assert rules.describe(found[0]) == (
        "entities switch.irrigation_pump: approval by users 123456789 within 10 min, off after 1800 s on"
    )
    assert rules.describe(found[1]) == "entities switch.field_*_valve: at most 6 calls an hour, 30 s between calls"


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"entities": [PUMP], "maxCallsPerHr": 6}, "policy.rules.0.maxCallsPerHr: unknown key"),
        ({"entities": [PUMP], "requireApproval": {"approver": [1]}}, "policy.rules.0.requireApproval.object.approver"),
        ({"entity": [PUMP], "requireApproval": True}, "policy.rules.0.entity: unknown key"),
    ],
)
def test_an_unknown_key_is_refused_naming_it(entry: dict[str, Any], where: str) -> None:
    assert problem(entry).startswith(where)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"requireApproval": True}, "needs entities, services or actions"),
        ({"entities": [PUMP]}, "a rule needs requireApproval"),
        ({"entities": [PUMP], "requireApproval": False}, "a rule needs requireApproval"),
        ({"services": ["switch.turn_on"], "maxOnSeconds": 60}, "maxOnSeconds needs entities"),
        ({"entities": [PUMP], "valueRange": [50, 10]}, "low <= high"),
        ({"actions": ["ha_set_entity"], "maxCallsPerHour": 3}, "count per entity: give entities"),
        ({"entities": [PUMP], "maxCallsPerHour": 0}, "greater than or equal to 1"),
        ({"entities": [PUMP], "maxCallsPerHour": "6"}, "valid integer"),  # strict: no strings for numbers
        ({"entities": [PUMP], "minSecondsBetween": 0}, "greater than 0"),
        ({"entities": [PUMP], "valueRange": [1]}, "at least 2"),
        ({"entities": [PUMP], "requireApproval": {"expiresMinutes": 0.01}}, "greater than or equal to 0.05"),
        ({"entities": [PUMP], "requireApproval": {"approvers": []}}, "at least 1"),
        ({"entities": ["Switch.Pump"], "requireApproval": True}, "pattern"),
        ({"entities": [PUMP], "requireApproval": "yes"}, "requireApproval"),
    ],
)
def test_an_incoherent_rule_is_refused_with_a_reason(entry: dict[str, Any], says: str) -> None:
    assert says in problem(entry)


def test_a_broken_rule_makes_the_profile_refuse_control() -> None:
    with pytest.raises(ProfileInvalid):
        parsed({"entities": [PUMP], "requireApproval": True}, {"entities": [PUMP], "maxOnSecond": 5})


# matching and the pure checks --------------------------------------------------------------------------


def test_rules_cover_calls_by_entity_glob_service_glob_or_action() -> None:
    by_entity, by_service, by_action, both = parsed(
        {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 6},
        {"services": ["switch.turn_*"], "requireApproval": True},
        {"actions": ["ha_restart"], "requireApproval": True},
        {"entities": [PUMP], "services": ["switch.turn_on"], "requireApproval": True},
    )
    every = (by_entity, by_service, by_action, both)
    valve_on = ControlCall(action="ha_call_service", service="switch.turn_on", entities=("switch.field_1_valve",))
    pump_off = ControlCall(action="ha_set_entity", service="switch.turn_off", entities=(PUMP,))
    pump_on = ControlCall(action="ha_set_entity", service="switch.turn_on", entities=(PUMP,))
    by_area = ControlCall(action="ha_call_service", service="switch.turn_on", indirect=True)
    assert rules.matching(every, valve_on) == [by_entity, by_service]
    assert rules.matching(every, pump_off) == [by_service]
    assert rules.matching(every, pump_on) == [by_service, both]
    assert rules.matching(every, ControlCall(action="ha_restart")) == [by_action]
    assert rules.matching(every, by_area) == [by_entity, by_service, both]  # it may reach them


def test_a_rule_written_by_service_covers_every_call_and_change_with_that_effect() -> None:
    light_on, ranged = parsed(
        {"services": ["light.turn_on"], "requireApproval": True},
        {"services": ["number.set_value"], "valueRange": [0, 100]},
    )
    every = (light_on, ranged)
    toggle = gate.describe("ha_call_service", HaCallServiceParams.model_validate(
        {"domain": "light", "service": "toggle", "target": {"entity_id": "light.barn_light"}}
    ))  # fmt: skip
    assert toggle is not None and rules.matching(every, toggle) == [light_on]
    assert effects.services_leading_to("light.barn_light", "on") == ["light.turn_on", "light.toggle"]
    assert effects.rules_of_change(every, "light.barn_light", "on") == [light_on]
    assert effects.rules_of_change(every, "light.barn_light", "off") == []
    assert effects.rules_of_change(every, "number.irrigation_duration", "110.0") == [ranged]
    assert effects.rules_of_change(every, "input_number.irrigation_duration_raw", "110.0") == []
    assert effects.rules_of_change(every, "input_boolean.barn_light_relay", "on") == []


def test_approval_for_intersects_approvers_and_takes_the_shortest_wait() -> None:
    one, two, anyone = parsed(
        {"entities": [PUMP], "requireApproval": {"approvers": [1, 2], "expiresMinutes": 5}},
        {"services": ["switch.*"], "requireApproval": {"approvers": [2, 3], "expiresMinutes": 2}},
        {"entities": ["switch.*"], "requireApproval": True},
    )
    both = rules.approval_for([one, two, anyone])
    assert both is not None and both.approvers == frozenset({2}) and both.expires_minutes == 2
    chat = rules.approval_for([anyone])
    assert chat is not None and chat.approvers is None and chat.expires_minutes == rules.DEFAULT_EXPIRES_MINUTES
    assert rules.approval_for(list(parsed({"entities": [PUMP], "maxCallsPerHour": 1}))) is None


def test_value_range_and_targets_refuse_with_sentences() -> None:
    (ranged,) = parsed({"entities": ["number.irrigation_duration"], "valueRange": [0, 120]})
    setting = ControlCall(action="ha_set_entity", service="number.set_value", entities=("number.irrigation_duration",))
    rules.check_value_range([ranged], ControlCall(**{**setting.__dict__, "value": "120"}))
    with pytest.raises(NotAllowed, match="between 0 and 120; 121 is outside that range"):
        rules.check_value_range([ranged], ControlCall(**{**setting.__dict__, "value": 121}))
    with pytest.raises(NotAllowed, match="set it with ha_set_entity"):
        rules.check_value_range([ranged], ControlCall(**{**setting.__dict__, "value": True}))
    with pytest.raises(NotAllowed, match="target.entity_id"):
        rules.check_targets([ranged], ControlCall(action="ha_call_service", service="number.set_value", indirect=True))


def test_entity_id_all_is_an_indirect_target_for_the_rules() -> None:
    params = HaCallServiceParams.model_validate(
        {"domain": "switch", "service": "turn_on", "target": {"entity_id": ["all", "switch.field_1_valve"]}}
    )
    call = gate.describe("ha_call_service", params)
    assert call is not None and call.indirect and call.entities == ("switch.field_1_valve",)
    (rule,) = parsed({"entities": [PUMP], "requireApproval": True})
    assert rules.matching((rule,), call) == [rule]
    with pytest.raises(NotAllowed, match='not "all"'):
        rules.check_targets([rule], call)


def test_describe_ha_set_entity() -> None:
    call = gate.describe("ha_set_entity", HaSetEntityParams.model_validate({"entityId": PUMP, "value": "ON"}))
    assert call == ControlCall(
        action="ha_set_entity",
        service="switch.turn_on",
        entities=(PUMP,),
        value="ON",
        turns_on=True,
        effect_services=("switch.turn_on", "switch.toggle"),  # a rule on either holds the pump going on
    )
    assert gate.describe("ha_get_status", HaSetEntityParams.model_validate({"entityId": PUMP, "value": 1})) is None


# the safe direction and the effect of a call (issue 32) ----------------------------------------------------

GUARDS = parsed(
    {"entities": [PUMP], "requireApproval": True},
    {"entities": ["valve.field_*"], "maxCallsPerHour": 4},
    {"entities": ["number.irrigation_duration"], "valueRange": [10, 120], "requireApproval": True},
    {"entities": ["select.fertigation_program"], "requireApproval": True, "safeState": "none"},
)


def _described(action: str, params: dict[str, Any]) -> tuple[ControlCall, dict[str, Any]]:
    model = HaCallServiceParams if action == "ha_call_service" else HaSetEntityParams
    checked = model.model_validate(params)
    call = gate.describe(action, checked)
    assert call is not None
    return call, checked.model_dump(mode="json", exclude_none=True)


def _call(domain: str, service: str, **parts: Any) -> tuple[str, dict[str, Any]]:
    return "ha_call_service", {"domain": domain, "service": service, **parts}


SAFE = [
    ("ha_set_entity", {"entityId": PUMP, "value": "off"}),
    ("ha_set_entity", {"entityId": PUMP, "value": False}),
    _call("switch", "turn_off", target={"entity_id": PUMP}),
    _call("switch", "turn_off", data={"entity_id": [PUMP, "switch.barn"]}),  # every entity named goes off
    _call("valve", "close_valve", target={"entity_id": "valve.field_1"}),
    ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": 10}),
    ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": "10.0"}),
    _call("number", "set_value", target={"entity_id": "number.irrigation_duration"}, data={"value": 10}),
    ("ha_set_entity", {"entityId": "select.fertigation_program", "value": "none"}),
    _call("select", "select_option", target={"entity_id": "select.fertigation_program"}, data={"option": "none"}),
]
NOT_SAFE = [
    ("ha_set_entity", {"entityId": PUMP, "value": "on"}),
    _call("switch", "toggle", target={"entity_id": PUMP}),
    _call("switch", "turn_off", target={"area_id": "field"}),  # what HA resolves cannot be stated
    _call("switch", "turn_off", target={"entity_id": ["all"]}),
    _call("switch", "turn_off", target={"entity_id": PUMP, "device_id": "d1"}),
    _call("light", "turn_off", target={"entity_id": PUMP}),  # another domain's service
    _call("valve", "open_valve", target={"entity_id": "valve.field_1"}),
    _call("valve", "set_valve_position", target={"entity_id": "valve.field_1"}, data={"position": 0}),
    ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": 11}),
    _call("number", "set_value", target={"entity_id": "number.irrigation_duration"}),
    ("ha_set_entity", {"entityId": "select.fertigation_program", "value": "grow"}),
    ("ha_set_entity", {"entityId": "select.other_program", "value": "none"}),  # no safeState: none known
]


@pytest.mark.parametrize(("action", "params"), SAFE)
def test_a_call_to_the_safe_state_is_the_safe_direction(action: str, params: dict[str, Any]) -> None:
    assert gate.only_safe(*_described(action, params), GUARDS, {})


@pytest.mark.parametrize(("action", "params"), NOT_SAFE)
def test_anything_else_is_not_the_safe_direction(action: str, params: dict[str, Any]) -> None:
    assert not gate.only_safe(*_described(action, params), GUARDS, {})


def test_a_number_without_a_range_is_safe_at_the_min_ha_reports_for_it() -> None:
    under = parsed({"entities": ["input_number.air_humidity_raw"], "requireApproval": True})
    low = _described("ha_set_entity", {"entityId": "input_number.air_humidity_raw", "value": 0})
    higher = _described("ha_set_entity", {"entityId": "input_number.air_humidity_raw", "value": 1})
    reported = {"input_number.air_humidity_raw": {"min": 0, "max": 100}}
    assert gate.only_safe(*low, under, reported)
    assert not gate.only_safe(*higher, under, reported)
    assert not gate.only_safe(*low, under, {})  # HA could not say: its low end is unknown, so the rule holds


PUMP_ON = [
    ("ha_set_entity", {"entityId": PUMP, "value": "on"}),
    ("ha_set_entity", {"entityId": PUMP, "value": True}),
    ("ha_set_entity", {"entityId": PUMP, "value": " YES "}),
    _call("switch", "turn_on", target={"entity_id": PUMP}),
    _call("switch", "turn_on", target={"entity_id": [PUMP, PUMP]}),
    _call("switch", "turn_on", data={"entity_id": PUMP}),
    _call("switch", "turn_on", data={"entity_id": PUMP, "note": 1}, target={"entity_id": PUMP}),
    _call("switch", "turn_on", data={"note": 1, "entity_id": PUMP}),
]


def test_the_wordings_of_one_effect_share_its_identity_and_other_effects_do_not() -> None:
    pump_on = {json.dumps(gate.effect_of(*_described(a, p)), sort_keys=True) for a, p in PUMP_ON}
    assert len(pump_on) == 1
    duration = [
        ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": 60}),
        ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": "60.0"}),
        _call("number", "set_value", target={"entity_id": "number.irrigation_duration"}, data={"value": 6e1}),
    ]
    assert len({json.dumps(gate.effect_of(*_described(a, p)), sort_keys=True) for a, p in duration}) == 1
    others = [
        ("ha_set_entity", {"entityId": PUMP, "value": "off"}),
        ("ha_set_entity", {"entityId": "switch.field_1_valve", "value": "on"}),
        _call("switch", "turn_on", target={"entity_id": [PUMP, "switch.field_1_valve"]}),
        _call("switch", "turn_on", target={"area_id": "field"}),
        _call("switch", "turn_on", target={"area_id": "barn"}),
        _call("switch", "toggle", target={"entity_id": PUMP}),
        ("ha_set_entity", {"entityId": "number.irrigation_duration", "value": 61}),
        _call("light", "turn_on", target={"entity_id": "light.barn"}, data={"brightness": 10}),
        _call("climate", "set_temperature", target={"entity_id": "climate.barn"}, data={"temperature": 20}),
        _call("climate", "set_temperature", target={"entity_id": "climate.barn"}, data={"temperature": 21}),
    ]
    identities = [json.dumps(gate.effect_of(*_described(a, p)), sort_keys=True) for a, p in others]
    assert len(set(identities)) == len(others) and not pump_on & set(identities)


def test_the_state_an_approval_is_for_is_the_effects_tables() -> None:
    # lock.open leads to unlocked as lock.unlock does (effects.py): one approval; a toggle leads to no one state.
    door = "lock.barn_door"
    unlock, opened = (_call("lock", name, target={"entity_id": door}) for name in ("unlock", "open"))
    assert gate.effect_of(*_described(*unlock)) == gate.effect_of(*_described(*opened))
    assert gate.effect_of(*_described(*unlock))["state"] == effects.state_of("lock.unlock") == "unlocked"
    assert effects.state_of("switch.toggle") is None and effects.state_of("number.set_value") is None


# the approval buttons' data ----------------------------------------------------------------------------

approval_ids = st.binary(min_size=6, max_size=6).map(lambda b: "a-" + b.hex())


@given(approval_ids, st.sampled_from(["y", "n"]))
def test_callback_data_round_trips_within_telegrams_64_bytes(approval_id: str, choice: Any) -> None:
    data = callback_data(approval_id, choice)
    assert len(data.encode()) <= 64
    assert parse_callback(data) == (approval_id, choice)


@given(st.one_of(st.none(), st.text(max_size=80)))
def test_parse_callback_reads_only_its_own_exact_format(data: str | None) -> None:
    found = parse_callback(data)
    if found is not None:
        assert data == callback_data(*found)


@pytest.mark.parametrize(
    "data",
    [
        "fa:a-0123456789ab:x",
        "fa:a-0123456789AB:y",  # upper-case hex is not an id farmhost makes
        "fa:a-0123456789a:y",
        "fa:b-0123456789ab:y",
        "fa:a-0123456789ab:y:extra",
        "fa:a-0123456789ab",
        "approve:telegram:-500",
        "",
        "fa::y",
    ],
)
def test_parse_callback_refuses_near_misses(data: str) -> None:
    assert parse_callback(data) is None
