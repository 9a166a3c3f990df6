"""The farm state collector against the real Home Assistant: files, time zone, alert rules, outages, restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import scaled, wait_for_async
from ha_core_support import farm_host, make_data_dir
from ha_fixture import CALENDAR_ENTITY, HaInstance

from farmhost.config import FarmSettings, Settings, build_config
from farmhost.errors import InvalidRequest, Unavailable
from farmhost.farm.deps import FarmDeps
from farmhost.farm.homeassistant.client import HaAuthFailed, HAClient, HaUnavailable
from farmhost.farm.state.alerts import AlertThresholds
from farmhost.farm.state.collector import StateCollector, farm_state_refresh
from farmhost.farm.state.inventory import calendar_events, devices_document
from farmhost.farm.state.telemetry import file_name, numeric_values, prune_sync
from farmhost.layout import DataLayout
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.params import NoParams, parse_params

T = TypeVar("T")
# +05:45 all year (no DST): an offset no test machine has by accident, so a UTC or local date cannot pass for it.
FARM_TZ = "Asia/Kathmandu"
OFFSET = "+05:45"
ZONE = ZoneInfo(FARM_TZ)


async def eventually(condition: Callable[[], T], *, timeout: float = 10.0, what: str = "") -> T:
    """Poll `condition` (without blocking the event loop) until it is truthy, or fail after `timeout` (scaled) s."""
    return await wait_for_async(condition, timeout=timeout, interval=0.02, what=what)


def settle(ha: HaInstance, entity_id: str, state: str) -> None:
    """Wait until HA shows `entity_id` in `state` (template entities follow their helper a moment later)."""
    deadline = time.monotonic() + scaled(5)
    while ha.get_state(entity_id)["state"] != state:
        assert time.monotonic() < deadline, f"{entity_id} never became {state!r}: {ha.get_state(entity_id)}"
        time.sleep(0.02)


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "farmhost.farm.state.collector"]


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def settings_for(root: Path, ha: HaInstance, **extra: Any) -> FarmSettings:
    settings = Settings(_env_file=None, data_dir=root, tz=FARM_TZ, ha_url=ha.url, ha_token=ha.farmhost_token, **extra)  # type: ignore[call-arg]
    return build_config(settings).farm


@pytest.fixture
async def client(ha_reset: HaInstance) -> AsyncIterator[HAClient]:
    async with HAClient(url=ha_reset.url, token=ha_reset.token) as ha_client:
        yield ha_client


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    return DataLayout(tmp_path / "data")


def collector_for(client: HAClient, layout: DataLayout, ha: HaInstance, **options: Any) -> StateCollector:
    return StateCollector(ha=client, layout=layout, settings=replace(settings_for(layout.root, ha).state, **options))


def alert_keys(doc: dict[str, Any], which: str = "active") -> list[tuple[str, str, str]]:
    return [(a["rule"], a["entityId"], a["severity"]) for a in doc[which]]


# ---------------------------------------------------------------------------------------------- the files


async def test_a_refresh_writes_every_file_with_farm_local_dates(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    collector = collector_for(client, layout, ha_reset)
    summary = await collector.refresh_now(telemetry=True)

    state_dir = layout.farm_state
    today = datetime.now(ZONE).date()
    telemetry_name = f"telemetry-{today.isoformat()}.ndjson"
    assert summary.ha_connected and summary.error is None
    assert set(summary.files) == {"current.json", "alerts.json", "devices.json", "calendar.json", telemetry_name}
    assert sorted(os.listdir(state_dir)) == sorted(summary.files)  # no temp files left behind

    current = read(state_dir / "current.json")
    assert current["haConnected"] is True and "staleSince" not in current
    assert current["generatedAt"].endswith(OFFSET) and current["generatedAt"] == summary.generated_at
    moisture = current["entities"]["sensor.field_1_soil_moisture"]
    assert moisture["state"] == "45.0" and moisture["unit"] == "%" and moisture["deviceClass"] == "moisture"
    assert moisture["friendlyName"] == "Field 1 soil moisture" and moisture["lastChanged"].endswith(OFFSET)
    assert current["entities"]["switch.irrigation_pump"]["state"] == "off"
    assert len(current["entities"]) == summary.entities == len(ha_reset.get_states())
    assert current["alerts"] == [] and read(state_dir / "alerts.json") == {"active": [], "resolved": []}
    context = current["context"]
    assert context["timezone"] == FARM_TZ and context["farmMode"] == "demo" and context["haVersion"] == "2025.4.4"
    assert context["location"]["name"] == "Farm Test" and context["location"]["latitude"] == pytest.approx(52.37)

    calendar = read(state_dir / "calendar.json")
    assert calendar["calendars"] == [CALENDAR_ENTITY] and "note" not in calendar
    assert [e["summary"] for e in calendar["events"]] == ["Irrigate field 1", "Fertigation (bloom)"]
    for event in calendar["events"]:
        assert event["calendar"] == CALENDAR_ENTITY and event["allDay"] is False
        assert event["start"].endswith(OFFSET) and event["end"].endswith(OFFSET)
        assert calendar["start"] <= event["start"] <= calendar["end"]
    assert datetime.fromisoformat(calendar["end"]) - datetime.fromisoformat(calendar["start"]) == timedelta(days=14)

    devices = read(state_dir / "devices.json")
    assert devices["source"] == "registry" and devices["generatedAt"].endswith(OFFSET)
    assert "sensor.field_1_soil_moisture" in devices["domains"]["sensor"]

    [line] = (state_dir / telemetry_name).read_text().splitlines()
    sample = json.loads(line)
    assert sample["ts"].endswith(OFFSET)
    assert sample["values"] == {
        "sensor.air_humidity": 65.0,
        "sensor.air_temperature": 14.5,
        "sensor.field_1_soil_moisture": 45.0,
        "sensor.field_2_soil_moisture": 38.0,
    }


async def test_devices_json_lists_areas_from_the_registries(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    areas = await client.ws_command("config/area_registry/list")
    area = next((a for a in areas if a["name"] == "Field 1"), None)
    if area is None:
        area = await client.ws_command("config/area_registry/create", name="Field 1")
    await client.ws_command(
        "config/entity_registry/update", entity_id="sensor.field_1_soil_moisture", area_id=area["area_id"]
    )
    await collector_for(client, layout, ha_reset).refresh_now()

    devices = read(layout.farm_state / "devices.json")
    [field_1] = [a for a in devices["areas"] if a["name"] == "Field 1"]
    assert field_1["id"] == area["area_id"] and field_1["entities"] == ["sensor.field_1_soil_moisture"]
    assert "sensor.field_1_soil_moisture" not in devices["withoutArea"]
    assert "sensor.field_2_soil_moisture" in devices["withoutArea"]
    backup = [d for d in devices["devices"] if d["name"] == "Backup"]  # HA's own backup integration has a device
    assert backup and all(e.startswith("sensor.backup_") for e in backup[0]["entities"])


DOCS = Path(__file__).resolve().parents[2] / "docs" / "farm-state.md"


def documented_examples() -> dict[str, list[Any]]:
    """The JSON examples of docs/farm-state.md, by section title (`current.json`, ...)."""
    examples: dict[str, list[Any]] = {}
    for section in re.split(r"^## ", DOCS.read_text(), flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0].strip("`")
        examples[title] = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)]
    return examples


async def test_the_documented_examples_have_the_shape_of_real_files(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    collector = collector_for(client, layout, ha_reset, thresholds=AlertThresholds(soil_low_percent=50))
    summary = await collector.refresh_now()  # field 1 at 45 % is "low" at 50 %: one active alert to compare
    docs = documented_examples()
    real = {
        name: read(layout.farm_state / name)
        for name in ("current.json", "alerts.json", "devices.json", "calendar.json")
    }
    [fresh, stale] = docs["current.json"]
    assert fresh.keys() == real["current.json"].keys()
    assert stale.keys() == {*real["current.json"], "staleSince", "haError"}
    assert fresh["context"].keys() == real["current.json"]["context"].keys()
    documented_entity = fresh["entities"]["sensor.field_1_soil_moisture"]
    assert documented_entity.keys() == real["current.json"]["entities"]["sensor.field_1_soil_moisture"].keys()
    [alerts] = docs["alerts.json"]
    assert alerts["active"][0].keys() == real["alerts.json"]["active"][0].keys()
    assert alerts["resolved"][0].keys() == {*real["alerts.json"]["active"][0], "resolvedAt"}
    [devices] = docs["devices.json"]
    assert devices.keys() == real["devices.json"].keys()
    assert devices["devices"][0].keys() == real["devices.json"]["devices"][0].keys()
    [calendar] = docs["calendar.json"]
    assert calendar.keys() == real["calendar.json"].keys()
    assert calendar["events"][0].keys() == real["calendar.json"]["events"][0].keys()
    [result] = docs["farm_state_refresh"]
    assert result.keys() == summary.to_json().keys()


# ---------------------------------------------------------------------------------------------- the rules


def _frost(ha: HaInstance) -> None:
    ha.set_number("sensor.air_temperature", 1.0)
    settle(ha, "binary_sensor.frost_risk", "on")


def _problem(ha: HaInstance) -> None:
    ha.set_state("input_boolean.pump_fault_sim", True)
    settle(ha, "binary_sensor.pump_fault", "on")


def _soil(ha: HaInstance) -> None:
    ha.set_number("sensor.field_1_soil_moisture", 12.5)
    settle(ha, "sensor.field_1_soil_moisture", "12.5")


def _reset(ha: HaInstance) -> None:
    ha.reset()
    settle(ha, "binary_sensor.frost_risk", "off")
    settle(ha, "binary_sensor.pump_fault", "off")


def _smoke(ha: HaInstance) -> None:
    ha.write_state("binary_sensor.barn_smoke", "on", {"device_class": "smoke", "friendly_name": "Barn smoke"})


def _smoke_gone(ha: HaInstance) -> None:
    ha.api("DELETE", "/api/states/binary_sensor.barn_smoke")  # an entity removed from HA resolves its alerts


WRITTEN = ("binary_sensor.barn_smoke", "sensor.probe_3_moisture")  # states the tests create: removed afterwards


def _forget_written(ha: HaInstance) -> None:
    present = {s["entity_id"] for s in ha.get_states()}
    for entity_id in WRITTEN:
        if entity_id in present:
            ha.api("DELETE", f"/api/states/{entity_id}")


def _probe_down(ha: HaInstance) -> None:
    ha.write_state("sensor.probe_3_moisture", "unavailable", {"device_class": "moisture", "unit_of_measurement": "%"})


def _probe_back(ha: HaInstance) -> None:
    ha.write_state("sensor.probe_3_moisture", "31", {"device_class": "moisture", "unit_of_measurement": "%"})


# (rule, drive, undo, expected active alerts, message fragment)
DRIVEN: list[
    tuple[str, Callable[[HaInstance], None], Callable[[HaInstance], None], list[tuple[str, str, str]], str]
] = [
    (
        "frost",
        _frost,
        _reset,
        [("frost", "binary_sensor.frost_risk", "critical"), ("frost", "sensor.air_temperature", "warning")],
        "Air temperature is 1 °C, below 2 °C",
    ),
    ("problem", _problem, _reset, [("problem", "binary_sensor.pump_fault", "warning")], "Pump fault"),
    (
        "soil_moisture_low",
        _soil,
        _reset,
        [("soil_moisture_low", "sensor.field_1_soil_moisture", "warning")],
        "Field 1 soil moisture is 12.5 %, below 25 %",
    ),
    (
        "safety",
        _smoke,
        _smoke_gone,
        [("safety", "binary_sensor.barn_smoke", "critical")],
        "Smoke detected by Barn smoke",
    ),
    ("unavailable", _probe_down, _probe_back, [("unavailable", "sensor.probe_3_moisture", "warning")], "unavailable"),
]


@pytest.mark.parametrize(("rule", "drive", "undo", "expected", "fragment"), DRIVEN, ids=[d[0] for d in DRIVEN])
async def test_each_rule_fires_and_resolves_when_the_farm_changes(
    client: HAClient,
    layout: DataLayout,
    ha_reset: HaInstance,
    rule: str,
    drive: Callable[[HaInstance], None],
    undo: Callable[[HaInstance], None],
    expected: list[tuple[str, str, str]],
    fragment: str,
) -> None:
    # no grace for the unavailable rule: the test cannot wait 10 minutes
    collector = collector_for(client, layout, ha_reset, thresholds=AlertThresholds(unavailable_minutes=0))
    alerts_file, current_file = layout.farm_state / "alerts.json", layout.farm_state / "current.json"
    await collector.refresh_now()
    assert read(alerts_file)["active"] == []
    try:
        drive(ha_reset)
        summary = await collector.refresh_now()
        raised = read(alerts_file)
        assert alert_keys(raised) == expected and summary.active_alerts == len(expected)
        assert read(current_file)["alerts"] == raised["active"]
        assert fragment in raised["active"][-1]["message"]
        for alert in raised["active"]:
            assert alert["since"].endswith(OFFSET) and alert["id"].startswith(f"{rule}:{alert['entityId']}:")
            assert "resolvedAt" not in alert
    finally:
        undo(ha_reset)
    try:
        await collector.refresh_now()
    finally:
        _forget_written(ha_reset)
    resolved = read(alerts_file)
    assert resolved["active"] == [] and read(current_file)["alerts"] == []
    assert sorted(alert_keys(resolved, "resolved")) == sorted(expected)
    before = {a["id"]: a for a in raised["active"]}
    for alert in resolved["resolved"]:
        assert alert["resolvedAt"].endswith(OFFSET) and alert["resolvedAt"] >= alert["since"]
        assert alert["since"] == before[alert["id"]]["since"]


async def test_thresholds_are_the_operators(client: HAClient, layout: DataLayout, ha_reset: HaInstance) -> None:
    ha_reset.set_number("sensor.field_2_soil_moisture", 30)  # fine at 25 %, low at 35 %
    settle(ha_reset, "sensor.field_2_soil_moisture", "30.0")
    thresholds = AlertThresholds(soil_low_percent=35, ignored_entities=frozenset({"sensor.field_1_soil_moisture"}))
    ha_reset.set_number("sensor.field_1_soil_moisture", 5)  # ignored
    settle(ha_reset, "sensor.field_1_soil_moisture", "5.0")
    await collector_for(client, layout, ha_reset, thresholds=thresholds).refresh_now()
    assert alert_keys(read(layout.farm_state / "alerts.json")) == [
        ("soil_moisture_low", "sensor.field_2_soil_moisture", "warning")
    ]


async def test_an_alert_survives_a_restart_with_its_original_since(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    _soil(ha_reset)
    await collector_for(client, layout, ha_reset).refresh_now()
    [before] = read(layout.farm_state / "alerts.json")["active"]

    restarted = collector_for(client, layout, ha_reset)  # a new farmhost process: only the files remain
    await restarted.refresh_now()
    [after] = read(layout.farm_state / "alerts.json")["active"]
    assert after == before

    _reset(ha_reset)
    await restarted.refresh_now()
    doc = read(layout.farm_state / "alerts.json")
    assert doc["active"] == []
    [resolved] = doc["resolved"]
    assert resolved["id"] == before["id"] and resolved["since"] == before["since"] and "resolvedAt" in resolved

    again = collector_for(client, layout, ha_reset, resolved_keep=0)
    await again.refresh_now()
    assert read(layout.farm_state / "alerts.json") == {"active": [], "resolved": []}


# ---------------------------------------------------------------------------------------------- HA trouble


@pytest.mark.slow
async def test_while_ha_is_down_the_snapshot_stays_marked_stale_and_the_outage_is_logged_once(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="farmhost.farm.state.collector")
    collector = collector_for(client, layout, ha_reset)
    _soil(ha_reset)
    good = await collector.refresh_now()
    current_file = layout.farm_state / "current.json"
    fresh = read(current_file)
    alerts_before = read(layout.farm_state / "alerts.json")
    calendar_before = (layout.farm_state / "calendar.json").read_bytes()

    # An idle WebSocket left open makes HA's shutdown wait ~10 s for its close handshake (see the report); the
    # client reconnects by itself on the next call, so closing it here changes nothing the test looks at.
    await client.close()
    ha_reset.take_down()
    try:
        for _ in range(3):
            started = time.monotonic()
            summary = await collector.refresh_now()
            # refused connections fail fast: well within one request timeout, however busy the machine
            assert time.monotonic() - started < client.request_timeout
            assert not summary.ha_connected and isinstance(summary.error, HaUnavailable)
            assert "connection refused" in summary.error.message, summary.error
            assert set(summary.files) == {"current.json", "alerts.json"}
        stale = read(current_file)
        assert stale["haConnected"] is False and stale["staleSince"] == good.generated_at
        assert "unreachable" in stale["haError"]
        assert stale["entities"] == fresh["entities"] and stale["context"] == fresh["context"]
        assert read(layout.farm_state / "alerts.json") == alerts_before  # nothing resolves without data
        assert (layout.farm_state / "calendar.json").read_bytes() == calendar_before
        assert len([m for m in logged(caplog) if "not available" in m]) == 1, logged(caplog)  # not once per poll

        # farmhost restarting while HA is down still serves the last entities, still marked stale
        restarted = collector_for(client, layout, ha_reset)
        await restarted.refresh_now()
        assert read(current_file)["entities"] == fresh["entities"]
        assert read(current_file)["staleSince"] == good.generated_at
        assert read(layout.farm_state / "alerts.json") == alerts_before
    finally:
        ha_reset.ensure_running()

    back = await collector.refresh_now()
    assert back.ha_connected and read(current_file)["haConnected"] is True
    assert "staleSince" not in read(current_file)
    await collector.refresh_now()
    assert len([m for m in logged(caplog) if "back after" in m]) == 1, logged(caplog)


async def test_a_refused_token_marks_the_snapshot_stale_and_says_why(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    await collector_for(client, layout, ha_reset).refresh_now()
    async with HAClient(url=ha_reset.url, token="not-a-token") as bad:
        summary = await collector_for(bad, layout, ha_reset).refresh_now()
    assert isinstance(summary.error, HaAuthFailed) and not summary.ha_connected
    current = read(layout.farm_state / "current.json")
    assert current["haConnected"] is False and "token" in current["haError"]
    assert current["entities"]["sensor.field_1_soil_moisture"]["state"] == "45.0"


# ---------------------------------------------------------------------------------------------- the service


async def test_the_background_task_polls_samples_and_stops(
    client: HAClient, layout: DataLayout, ha_reset: HaInstance
) -> None:
    collector = collector_for(client, layout, ha_reset, poll_seconds=0.1, telemetry_seconds=0.2, inventory_seconds=0.5)
    telemetry_file = layout.farm_state / file_name(datetime.now(UTC), ZONE)
    alerts_file = layout.farm_state / "alerts.json"
    await collector.start()
    try:
        [task] = [t for t in asyncio.all_tasks() if t.get_name() == "farm-state-collector"]
        assert collector.running
        await eventually(lambda: telemetry_file.exists() and len(telemetry_file.read_text().splitlines()) >= 3)
        _soil(ha_reset)  # the next poll sees it, with no refresh_now()
        await eventually(lambda: alerts_file.exists() and read(alerts_file)["active"], what="the background poll")
        assert alert_keys(read(alerts_file)) == [("soil_moisture_low", "sensor.field_1_soil_moisture", "warning")]
    finally:
        await collector.stop()
    assert task.cancelled() and not collector.running
    lines = [json.loads(line) for line in telemetry_file.read_text().splitlines()]
    stamps = [line["ts"] for line in lines]
    assert stamps == sorted(stamps) and all(s.endswith(OFFSET) for s in stamps)
    await collector.stop()  # twice is fine


async def test_farm_state_refresh_action(client: HAClient, layout: DataLayout, ha_reset: HaInstance) -> None:
    settings = settings_for(layout.root, ha_reset)
    deps = FarmDeps(settings=settings, layout=layout, ha=client, dashboards_dir=layout.root / "dashboards")
    ctx: Any = None  # the action does not use the request context

    result = await farm_state_refresh(deps, ctx, NoParams())
    assert result["haConnected"] is True and result["activeAlerts"] == 0
    assert result["entities"] == len(read(layout.farm_state / "current.json")["entities"])
    assert set(result["files"]) == {"current.json", "alerts.json", "devices.json", "calendar.json"}
    assert result["generatedAt"].endswith(OFFSET)

    with pytest.raises(InvalidRequest, match="takes no params"):
        parse_params(NoParams, {"entityIds": ["x"]}, "farm_state_refresh")
    no_ha = FarmDeps(settings=settings, layout=layout, ha=None, dashboards_dir=layout.root / "dashboards")
    with pytest.raises(Unavailable, match="not configured"):
        await farm_state_refresh(no_ha, ctx, NoParams())

    async with HAClient(url="http://127.0.0.1:9", token="x") as nowhere:  # nothing listens on port 9
        down = FarmDeps(settings=settings, layout=layout, ha=nowhere, dashboards_dir=layout.root / "dashboards")
        with pytest.raises(HaUnavailable, match="haConnected false") as err:
            await farm_state_refresh(down, ctx, NoParams())
    assert err.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert read(layout.farm_state / "current.json")["haConnected"] is False


async def test_farm_state_refresh_through_the_ipc_engine(tmp_path: Path, ha_reset: HaInstance) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    current_file = data_dir / "farm-state" / "current.json"
    async with farm_host(data_dir, ha_env=ha_reset.env(), tz=FARM_TZ) as host:
        done = await host.ask("main", "farm_state_refresh", {})
        assert done["status"] == "success", done
        assert done["result"]["haConnected"] is True and done["result"]["generatedAt"].endswith(OFFSET)
        assert read(current_file)["generatedAt"] == done["result"]["generatedAt"]
        refused = await host.ask("field", "farm_state_refresh")  # farm actions are main-only by default
        assert refused["errorCode"] == "unauthorized"
        invalid = await host.ask("main", "farm_state_refresh", {"entityIds": ["sensor.x"]})
        assert invalid["errorCode"] == "invalid_request" and "takes no params" in invalid["error"]
        audited = [(line["action"], line["group"], line["status"]) for line in host.audit()]
        assert audited == [
            ("farm_state_refresh", "main", "success"),
            ("farm_state_refresh", "field", "error"),
            ("farm_state_refresh", "main", "error"),
        ]
    async with farm_host(data_dir, ha_env={"HA_URL": "http://127.0.0.1:9", "HA_TOKEN": "x"}, tz=FARM_TZ) as host:
        down = await host.ask("main", "farm_state_refresh")
        assert down["errorCode"] == "upstream_unavailable" and "haConnected false" in down["error"]
    stale = read(current_file)
    assert stale["haConnected"] is False and stale["staleSince"] == done["result"]["generatedAt"]


def test_the_collector_settings_come_from_the_environment(tmp_path: Path) -> None:
    state = build_config(Settings(_env_file=None, data_dir=tmp_path)).farm.state  # type: ignore[call-arg]
    assert state.thresholds == AlertThresholds()  # the defaults, wherever they are declared
    operator = Settings(  # type: ignore[call-arg]
        _env_file=None,
        FARMHOST_DATA_DIR=tmp_path,
        FARMHOST_STATE_POLL_SECONDS="5",
        FARMHOST_TELEMETRY_SECONDS="60",
        FARMHOST_ALERT_SOIL_LOW_PERCENT="30",
        FARMHOST_ALERT_IGNORE_ENTITIES="sensor.freezer, sensor.cold_room,",
    )
    state = build_config(operator).farm.state
    assert (state.poll_seconds, state.telemetry_seconds, state.inventory_seconds) == (5.0, 60.0, 300.0)
    assert state.thresholds == AlertThresholds(
        soil_low_percent=30.0, ignored_entities=frozenset({"sensor.freezer", "sensor.cold_room"})
    )


# ---------------------------------------------------------------------------------------------- pure helpers


def test_telemetry_samples_only_measurements() -> None:
    states = [
        {"entity_id": "sensor.a", "state": "1.5", "attributes": {"unit_of_measurement": "%"}},
        {"entity_id": "sensor.b", "state": "7", "attributes": {"state_class": "measurement"}},
        {"entity_id": "sensor.c", "state": "7", "attributes": {}},  # a bare number: no unit, no class
        {"entity_id": "sensor.d", "state": "2026-05-17T00:00:00+00:00", "attributes": {"device_class": "timestamp"}},
        {"entity_id": "sensor.e", "state": "unavailable", "attributes": {"unit_of_measurement": "%"}},
        {"entity_id": "sensor.f", "state": "inf", "attributes": {"unit_of_measurement": "%"}},
        {"entity_id": "input_number.g", "state": "3", "attributes": {"unit_of_measurement": "%"}},
    ]
    assert numeric_values(states) == {"sensor.a": 1.5, "sensor.b": 7.0}


def test_telemetry_files_are_named_by_the_farm_date_and_pruned(tmp_path: Path) -> None:
    late_utc = datetime(2026, 5, 17, 20, 0, tzinfo=UTC)  # already the 18th in Kathmandu
    assert file_name(late_utc, ZONE) == "telemetry-2026-05-18.ndjson"
    assert file_name(late_utc, ZoneInfo("America/Denver")) == "telemetry-2026-05-17.ndjson"
    for name in ("telemetry-2026-05-01.ndjson", "telemetry-2026-05-10.ndjson", "telemetry-2026-05-18.ndjson", "x.json"):
        (tmp_path / name).write_text("")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deleted = prune_sync(fd, today=datetime(2026, 5, 18).date(), keep_days=10)
    finally:
        os.close(fd)
    assert deleted == ["telemetry-2026-05-01.ndjson"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "telemetry-2026-05-10.ndjson",
        "telemetry-2026-05-18.ndjson",
        "x.json",
    ]


def test_calendar_events_all_day_and_timed() -> None:
    response = {
        "response": {
            "calendar.farm": {
                "events": [
                    {"start": "2026-05-18T06:00:00+02:00", "end": "2026-05-18T07:00:00+02:00", "summary": "Spray"},
                    {"start": "2026-05-18", "end": "2026-05-19", "summary": "Market day", "location": "Town"},
                    {"summary": "no start"},
                ]
            },
            "calendar.vet": "garbage",
        }
    }
    assert calendar_events(response, ZONE) == [
        {"calendar": "calendar.farm", "summary": "Market day", "allDay": True, "start": "2026-05-18", "end": "2026-05-19", "location": "Town"},
        {"calendar": "calendar.farm", "summary": "Spray", "allDay": False, "start": "2026-05-18T09:45:00+05:45", "end": "2026-05-18T10:45:00+05:45"},
    ]  # fmt: skip
    assert calendar_events(None, ZONE) == []


def test_devices_fall_back_to_entities_when_registries_are_unreadable() -> None:
    states = [{"entity_id": "switch.pump"}, {"entity_id": "sensor.soil"}, {"entity_id": "sensor.air"}]
    doc = devices_document(states, None, now=datetime(2026, 5, 17, tzinfo=UTC), zone=ZONE)
    assert doc["source"] == "states" and doc["areas"] == [] and doc["devices"] == []
    assert doc["domains"] == {"sensor": ["sensor.air", "sensor.soil"], "switch": ["switch.pump"]}
    assert doc["withoutArea"] == ["sensor.air", "sensor.soil", "switch.pump"] and doc["note"]
    assert doc["generatedAt"] == "2026-05-17T05:45:00+05:45"
