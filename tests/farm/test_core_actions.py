"""ha_get_status, ha_call_service, ha_set_entity and ha_restart against the real Home Assistant, through IPC files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import ok, refused, scaled
from ha_core_support import FarmHost, farm_host, make_data_dir
from ha_fixture import HaInstance


@pytest.fixture
async def host(tmp_path: Path, ha_reset: HaInstance) -> AsyncIterator[FarmHost]:
    """The IPC engine with the farm handlers, pointed at the session's HA (every helper at its default)."""
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_reset.env()) as farm:
        yield farm


# ha_get_status -----------------------------------------------------------------------------------------


async def test_get_status_all_and_filtered(host: FarmHost, ha: HaInstance) -> None:
    everything = ok(await host.ask("main", "ha_get_status"))
    ids = [s["entity_id"] for s in everything["states"]]
    assert ids == sorted(ids) and everything["count"] == len(ids) and everything["missing"] == []
    assert {"switch.irrigation_pump", "sensor.air_temperature", "calendar.farm"} <= set(ids)
    temperature = next(s for s in everything["states"] if s["entity_id"] == "sensor.air_temperature")
    assert set(temperature) == {"entity_id", "state", "attributes", "last_changed", "last_updated"}
    assert temperature["state"] == ha.get_state("sensor.air_temperature")["state"]

    # an entity matching either filter is kept; unknown ids are reported, not an error
    params = {"entityIds": ["sensor.air_temperature", "switch.no_such_thing"], "domains": ["binary_sensor"]}
    some = ok(await host.ask("main", "ha_get_status", params))
    assert {s["entity_id"] for s in some["states"]} == {
        "sensor.air_temperature",
        "binary_sensor.frost_risk",
        "binary_sensor.pump_fault",
    }
    assert some["missing"] == ["switch.no_such_thing"]
    assert ok(await host.ask("main", "ha_get_status", {"domains": ["no_such_domain"]}))["states"] == []


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"entityIds": ["../../etc/passwd"]}, ("entityIds.0", "must be an entity id")),
        ({"entityIds": ["sensor.air_temperature/../x"]}, ("entityIds.0",)),
        ({"entityIds": ["Sensor.Air"]}, ("entityIds.0",)),
        ({"domains": ["../sensor"]}, ("domains.0",)),
        ({"domains": "sensor"}, ("domains", "list")),
        ({"entity_ids": ["sensor.x"]}, ("unknown param 'entity_ids'", "entityIds, domains")),
    ],
)
async def test_get_status_refuses_bad_names(host: FarmHost, params: dict[str, Any], words: tuple[str, ...]) -> None:
    refused(await host.ask("main", "ha_get_status", params), "invalid_request", *words)


# ha_call_service ---------------------------------------------------------------------------------------


async def test_call_service_returns_changed_states(host: FarmHost, ha: HaInstance) -> None:
    params = {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.irrigation_pump"}}
    result = ok(await host.ask("main", "ha_call_service", params))
    assert result["service"] == "switch.turn_on"
    changed = {s["entity_id"]: s["state"] for s in result["changedStates"]}
    assert changed == {"switch.irrigation_pump": "on", "input_boolean.pump_relay": "on"}
    assert ha.get_state("switch.irrigation_pump")["state"] == "on"

    # entity_id inside data works too; nothing changes twice
    params = {"domain": "switch", "service": "turn_on", "data": {"entity_id": "switch.irrigation_pump"}}
    assert ok(await host.ask("main", "ha_call_service", params))["changedStates"] == []
    number = {"domain": "input_number", "service": "set_value"}
    params = {**number, "data": {"value": 3.5}, "target": {"entity_id": ["input_number.field_1_soil_moisture_raw"]}}
    changed = {
        s["entity_id"]: s["state"] for s in ok(await host.ask("main", "ha_call_service", params))["changedStates"]
    }
    assert changed["input_number.field_1_soil_moisture_raw"] == "3.5"


@pytest.mark.parametrize(
    ("params", "code", "words"),
    [
        ({"domain": "shell_command", "service": "wipe"}, "not_allowed", ("shell_command", "never allowed")),
        ({"domain": "homeassistant", "service": "turn_off"}, "not_allowed", ("homeassistant",)),
        ({"domain": "recorder", "service": "purge"}, "not_allowed", ("recorder",)),
        (
            {"domain": "switch", "service": "no_such_service"},
            "not_allowed",
            ("switch.no_such_service", "allowServices"),
        ),
        (
            {
                "domain": "input_number",
                "service": "set_value",
                "data": {"value": 1000},
                "target": {"entity_id": "input_number.field_1_soil_moisture_raw"},
            },
            "invalid_request",
            ("range 0.0 - 100.0",),
        ),
        (
            {
                "domain": "input_number",
                "service": "set_value",
                "data": {"value": 1, "bogus": 1},
                "target": {"entity_id": "input_number.field_1_soil_moisture_raw"},
            },
            "invalid_request",
            ("bogus",),
        ),
        ({"domain": "../switch", "service": "turn_on"}, "invalid_request", ("domain",)),
        ({"domain": "switch", "service": "turn_on/../../x"}, "invalid_request", ("service",)),
        ({"domain": "switch", "service": "turn_on", "target": {"entity_id": "../x"}}, "invalid_request", ("target",)),
        ({"domain": "switch", "service": "turn_on", "target": {"rooms": "x"}}, "invalid_request", ("rooms",)),
        ({"domain": "switch", "service": "turn_on", "data": {"entity_id": 5}}, "invalid_request", ("entity_id",)),
        ({"domain": "switch"}, "invalid_request", ("missing param 'service'",)),
    ],
)
async def test_call_service_refusals(
    host: FarmHost, ha: HaInstance, params: dict[str, Any], code: str, words: tuple[str, ...]
) -> None:
    refused(await host.ask("main", "ha_call_service", params), code, *words)
    assert ha.get_state("input_number.field_1_soil_moisture_raw")["state"] == "45.0"


# ha_set_entity -----------------------------------------------------------------------------------------

SETS = [
    ("input_number.air_temperature_raw", -3.5, "-3.5"),
    ("input_number.air_humidity_raw", "71", "71.0"),
    ("number.irrigation_duration", 45, "45.0"),
    ("input_boolean.pump_fault_sim", "YES", "on"),
    ("switch.field_1_valve", "On", "on"),
    ("switch.field_2_valve", True, "on"),
    ("light.barn_light", 1, "on"),
    ("fan.greenhouse_fan", "true", "on"),
    ("input_boolean.barn_light_relay", "no", "off"),
    ("input_select.irrigation_mode", "manual", "manual"),
    ("select.fertigation_program", "bloom", "bloom"),
]


async def test_set_entity_every_domain_and_spelling(host: FarmHost, ha: HaInstance) -> None:
    for entity_id, value, expected in SETS:
        result = ok(await host.ask("main", "ha_set_entity", {"entityId": entity_id, "value": value}))
        assert result["state"]["state"] == expected and result["confirmed"] is True, (entity_id, result)
        assert result["entityId"] == entity_id and result["requested"] == value
        assert ha.get_state(entity_id)["state"] == expected, entity_id
    # and back off, with the other spellings
    for entity_id, value in (("fan.greenhouse_fan", "OFF"), ("light.barn_light", 0), ("switch.field_2_valve", False)):
        result = ok(await host.ask("main", "ha_set_entity", {"entityId": entity_id, "value": value}))
        assert result["state"]["state"] == "off" and ha.get_state(entity_id)["state"] == "off"
    # the driven sensor follows the helper that was set
    assert ha.get_state("sensor.air_temperature")["state"] == "-3.5"


@pytest.mark.parametrize(
    ("params", "code", "words"),
    [
        ({"entityId": "input_number.air_temperature_raw", "value": 99}, "invalid_request", ("-30 to 50",)),
        ({"entityId": "number.irrigation_duration", "value": -1}, "invalid_request", ("0 to 240",)),
        ({"entityId": "input_number.air_temperature_raw", "value": "warm"}, "invalid_request", ("number",)),
        ({"entityId": "input_number.air_temperature_raw", "value": True}, "invalid_request", ("number",)),
        (
            {"entityId": "input_select.irrigation_mode", "value": "turbo"},
            "invalid_request",
            ("'auto', 'manual', 'off'",),
        ),
        ({"entityId": "select.fertigation_program", "value": 2}, "invalid_request", ("'none', 'grow', 'bloom'",)),
        ({"entityId": "switch.irrigation_pump", "value": "maybe"}, "invalid_request", ("on/off", "yes/no")),
        ({"entityId": "switch.irrigation_pump", "value": 2}, "invalid_request", ("1/0",)),
        (
            {"entityId": "sensor.air_temperature", "value": 3},
            "invalid_request",
            ("cannot set sensor", "ha_call_service"),
        ),
        ({"entityId": "switch.no_such_pump", "value": "on"}, "not_found", ("switch.no_such_pump",)),
        ({"entityId": "switch/../../x", "value": "on"}, "invalid_request", ("entityId",)),
        ({"entityId": "switch.irrigation_pump"}, "invalid_request", ("missing param 'value'",)),
        ({"entityId": "switch.irrigation_pump", "value": {"on": 1}}, "invalid_request", ("switched with",)),
    ],
)
async def test_set_entity_refusals(
    host: FarmHost, ha: HaInstance, params: dict[str, Any], code: str, words: tuple[str, ...]
) -> None:
    refused(await host.ask("main", "ha_set_entity", params), code, *words)
    assert ha.get_state("switch.irrigation_pump")["state"] == "off"
    assert ha.get_state("input_number.air_temperature_raw")["state"] == "14.5"


# authorisation, profile and the production gate --------------------------------------------------------


async def test_other_groups_are_refused_and_audited(host: FarmHost, ha: HaInstance) -> None:
    params = {"entityId": "switch.irrigation_pump", "value": "on"}
    refused(await host.ask("field", "ha_set_entity", params), "unauthorized", "main group")
    refused(await host.ask("field", "ha_get_status"), "unauthorized", "main group")
    assert ha.get_state("switch.irrigation_pump")["state"] == "off"
    lines = [line for line in host.audit() if line["group"] == "field"]
    assert [(line["action"], line["errorCode"]) for line in lines] == [
        ("ha_set_entity", "unauthorized"),
        ("ha_get_status", "unauthorized"),
    ]
    assert lines[0]["params"] == params and lines[0]["status"] == "error"


async def test_profile_narrows_control_and_opens_reads(host: FarmHost, ha: HaInstance) -> None:
    host.profile(
        {
            "policy": {
                "allowedDomains": ["switch", "input_select"],
                "allowedServices": ["switch.turn_on", "switch.turn_off", "input_select.select_option"],
                "allowedEntities": ["switch.field_*", "input_select.irrigation_mode"],
                "actionGroups": {"ha_get_status": ["*"], "ha_set_entity": ["main", "field"]},
            },
        }
    )
    assert ok(await host.ask("field", "ha_get_status", {"entityIds": ["switch.field_1_valve"]}))["count"] == 1
    ok(await host.ask("field", "ha_set_entity", {"entityId": "switch.field_1_valve", "value": "on"}))
    assert ha.get_state("switch.field_1_valve")["state"] == "on"
    refused(await host.ask("field", "ha_call_service", {"domain": "switch", "service": "toggle"}), "unauthorized")
    cases = [
        ("ha_set_entity", {"entityId": "switch.irrigation_pump", "value": "on"}, "switch.irrigation_pump"),
        ("ha_set_entity", {"entityId": "light.barn_light", "value": "on"}, "'light' domain"),
        ("ha_call_service", {"domain": "switch", "service": "toggle", "target": {"entity_id": "switch.field_2_valve"}}, "switch.toggle"),
        ("ha_call_service", {"domain": "switch", "service": "turn_on", "target": {"area_id": "barn"}}, "by entity_id"),
        ("ha_call_service", {"domain": "switch", "service": "turn_on", "target": {"entity_id": "all"}}, "all"),
    ]  # fmt: skip
    for action, params, word in cases:
        refused(await host.ask("main", action, params), "not_allowed", word)
    assert ha.get_state("switch.irrigation_pump")["state"] == "off"
    assert ha.get_state("light.barn_light")["state"] == "off"

    # a broken profile: control is refused naming the file, reads fall back to main-only
    host.profile('{"policy": {"allowedDomain": ["switch"]}}')
    message = refused(
        await host.ask("main", "ha_set_entity", {"entityId": "switch.field_2_valve", "value": "on"}), "not_allowed"
    )
    assert str(host.settings.profile_path) in message and "allowedDomain" in message
    assert ok(await host.ask("main", "ha_get_status", {"domains": ["switch"]}))["count"] == 3
    refused(await host.ask("field", "ha_get_status"), "unauthorized", "could not be read")
    host.profile(None)
    ok(await host.ask("main", "ha_set_entity", {"entityId": "switch.field_2_valve", "value": "on"}))


async def test_production_gate(tmp_path: Path, ha_reset: HaInstance) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    async with farm_host(data_dir, ha_env=ha_reset.env(), farm_mode="production") as host:
        params = {"entityId": "switch.irrigation_pump", "value": "on"}
        refused(
            await host.ask("main", "ha_set_entity", params), "not_allowed", "FARM_MODE=production", "no farm profile"
        )
        refused(await host.ask("main", "ha_restart"), "not_allowed", "FARM_MODE=production")
        host.profile({"validation": {"status": "pending"}})
        refused(await host.ask("main", "ha_set_entity", params), "not_allowed", "'pending'", "validation.status")
        assert ok(await host.ask("main", "ha_get_status", {"domains": ["switch"]}))["count"] == 3  # reads pass
        host.profile({"validation": {"status": "pass", "validatedAt": "2026-05-17"}})
        assert ok(await host.ask("main", "ha_set_entity", params))["state"]["state"] == "on"
    assert ha_reset.get_state("switch.irrigation_pump")["state"] == "on"
    ha_reset.reset()


async def test_home_assistant_not_configured(tmp_path: Path) -> None:
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=None) as host:
        refused(await host.ask("main", "ha_get_status"), "upstream_unavailable", "HA_URL and HA_TOKEN")
        refused(await host.ask("main", "ha_restart"), "upstream_unavailable", "HA_URL and HA_TOKEN")
        refused(await host.ask("field", "ha_get_status"), "unauthorized")
        # params are checked before HA is needed
        refused(await host.ask("main", "ha_get_status", {"bogus": 1}), "invalid_request", "bogus")
        assert [line["errorCode"] for line in host.audit()] == [
            "upstream_unavailable",
            "upstream_unavailable",
            "unauthorized",
            "invalid_request",
        ]


# ha_restart --------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_restart_through_the_api(host: FarmHost, ha: HaInstance) -> None:
    before = ha.hass_pid()
    refused(await host.ask("main", "ha_restart", {"now": True}), "invalid_request", "takes no params")
    result = ok(await host.ask("main", "ha_restart", timeout=60))
    # A new hass, RUNNING: what says HA restarted (the local HA's supervisor brings one back in ~0.3 s, so no
    # lower bound on the time).
    assert result["restarted"] is True and 0 < result["seconds"] < scaled(60)
    assert ha.hass_pid() != before and ha.core_state() == "RUNNING"
    # the client carries on over the new instance: REST and the WebSocket (call_service) both work
    params = {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.field_1_valve"}}
    assert ok(await host.ask("main", "ha_call_service", params))["changedStates"]
    assert (
        ok(await host.ask("main", "ha_get_status", {"entityIds": ["switch.field_1_valve"]}))["states"][0]["state"]
        == "on"
    )
    audit = [line for line in host.audit() if line["action"] == "ha_restart"]
    assert [line["status"] for line in audit] == ["error", "success"] and audit[1]["durationMs"] > 0
