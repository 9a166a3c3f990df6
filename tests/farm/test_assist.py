"""ha_assist against the real Home Assistant's Assist (the built-in intent agent), through IPC files."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import ok, refused
from ha_core_support import FarmHost, farm_host, make_data_dir
from ha_fixture import HaInstance

# Every entity the test farm exposes to Assist that Assist can control (sensors are only read).
CONTROLLABLE = [
    "fan.greenhouse_fan",
    "light.barn_light",
    "number.irrigation_duration",
    "select.fertigation_program",
    "switch.field_1_valve",
    "switch.field_2_valve",
    "switch.irrigation_pump",
]


@pytest.fixture
async def host(tmp_path: Path, ha_reset: HaInstance) -> AsyncIterator[FarmHost]:
    """The IPC engine with the farm handlers, pointed at the session's HA (every helper at its default)."""
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_reset.env()) as farm:
        yield farm


async def test_assist_acts_and_answers(host: FarmHost, ha: HaInstance) -> None:
    done = ok(await host.ask("main", "ha_assist", {"text": "turn on the irrigation pump"}))
    assert done["responseType"] == "action_done" and done["understood"] is True
    assert done["speech"] == "Turned on the switch"
    assert done["targets"] == ["switch.irrigation_pump"] and done["failed"] == []
    assert ha.get_state("switch.irrigation_pump")["state"] == "on"
    assert ha.get_state("input_boolean.pump_relay")["state"] == "on"  # the simulated relay followed

    moisture = ok(
        await host.ask("main", "ha_assist", {"text": "what is the soil moisture of field 1", "language": "en"})
    )
    assert moisture["responseType"] == "query_answer"
    assert moisture["speech"] == "Soil moisture of field 1 is 45.0 %"
    assert moisture["targets"] == ["sensor.field_1_soil_moisture"] and moisture["language"] == "en"

    light = ok(await host.ask("main", "ha_assist", {"text": "is the barn light on"}))
    assert (light["responseType"], light["speech"], light["targets"]) == (
        "query_answer",
        "No, off",
        ["light.barn_light"],
    )


async def test_assist_not_understanding_is_an_answer(host: FarmHost) -> None:
    result = ok(await host.ask("main", "ha_assist", {"text": "sing me a song about tractors"}))
    assert result["understood"] is False and result["responseType"] == "error"
    assert result["errorCode"] == "no_intent_match" and result["speech"] == "Sorry, I couldn't understand that"
    unknown = ok(await host.ask("main", "ha_assist", {"text": "turn on the combine harvester"}))
    assert unknown["errorCode"] == "no_valid_targets" and "combine harvester" in unknown["speech"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, ("missing param 'text'", "text, language")),
        ({"text": ""}, ("text",)),
        ({"text": "   "}, ("words for Assist",)),
        ({"text": "x" * 1001}, ("text",)),
        ({"text": "hi", "language": "../en"}, ("language tag",)),
        ({"text": "hi", "agent_id": "conversation.openai"}, ("unknown param 'agent_id'",)),
    ],
)
async def test_assist_params(host: FarmHost, params: dict[str, Any], words: tuple[str, ...]) -> None:
    refused(await host.ask("main", "ha_assist", params), "invalid_request", *words)


async def test_assist_other_groups_are_refused_and_audited(host: FarmHost, ha: HaInstance) -> None:
    params = {"text": "turn on the irrigation pump"}
    refused(await host.ask("field", "ha_assist", params), "unauthorized", "ha_assist", "main group")
    assert ha.get_state("switch.irrigation_pump")["state"] == "off"

    host.profile({"policy": {"actionGroups": {"ha_assist": ["main", "field"]}}})
    assert ok(await host.ask("field", "ha_assist", params))["targets"] == ["switch.irrigation_pump"]
    assert ha.get_state("switch.irrigation_pump")["state"] == "on"

    lines = [line for line in host.audit() if line["action"] == "ha_assist"]
    assert [(line["group"], line["status"], line["errorCode"]) for line in lines] == [
        ("field", "error", "unauthorized"),
        ("field", "success", None),
    ]
    assert all(line["params"] == params for line in lines)


async def test_assist_under_a_narrowing_profile(host: FarmHost, ha: HaInstance) -> None:
    """Assist picks entity and service itself: the profile is held against everything exposed to it."""
    params = {"text": "turn on the barn light"}
    host.profile({"policy": {"allowedEntities": ["switch.irrigation_pump"]}})
    message = refused(await host.ask("main", "ha_assist", params), "not_allowed", "exposes", "allowedEntities")
    assert "light.barn_light" in message and "sensor." not in message  # sensors are only read
    host.profile({"policy": {"allowedDomains": ["switch"]}})
    refused(await host.ask("main", "ha_assist", params), "not_allowed", "fan.greenhouse_fan", "allowedDomains")
    host.profile({"policy": {"allowedServices": ["light.turn_on"]}})
    refused(await host.ask("main", "ha_assist", params), "not_allowed", "allowedServices", "chooses the service")
    assert ha.get_state("light.barn_light")["state"] == "off"

    # a profile that covers every entity Assist can control lets it act
    host.profile(
        {"policy": {"allowedEntities": CONTROLLABLE, "allowedDomains": ["switch", "light", "fan", "number", "select"]}}
    )
    assert ok(await host.ask("main", "ha_assist", params))["targets"] == ["light.barn_light"]
    assert ha.get_state("light.barn_light")["state"] == "on"
    host.profile(None)


async def test_assist_production_gate(tmp_path: Path, ha_reset: HaInstance) -> None:
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_reset.env(), farm_mode="production") as host:
        refused(
            await host.ask("main", "ha_assist", {"text": "turn on the pump"}), "not_allowed", "FARM_MODE=production"
        )
    assert ha_reset.get_state("switch.irrigation_pump")["state"] == "off"


async def test_assist_home_assistant_down(tmp_path: Path) -> None:
    with socket.socket() as holder:  # a port nothing answers on: Home Assistant is down
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    down = {"HA_URL": f"http://127.0.0.1:{port}", "HA_TOKEN": "not-a-token"}
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=down, request_timeout=3.0) as host:
        refused(
            await host.ask("main", "ha_assist", {"text": "turn on the pump"}), "upstream_unavailable", "unreachable"
        )
        assert [line["errorCode"] for line in host.audit()] == ["upstream_unavailable"]
    async with farm_host(make_data_dir(tmp_path / "off"), ha_env=None) as host:
        refused(await host.ask("main", "ha_assist", {"text": "hello"}), "upstream_unavailable", "HA_URL and HA_TOKEN")
