"""ha_history against the real Home Assistant's recorder, through IPC files: summaries match what the test did."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import ok, refused, wait_for, wait_for_async
from ha_core_support import FarmHost, farm_host, make_data_dir
from ha_fixture import HaInstance

from farmhost.farm.state.history import MAX_POINTS, Change, entity_summaries, history_slices, summarise

TEMPERATURE = "sensor.air_temperature"
PUMP = "switch.irrigation_pump"
ZONE = ZoneInfo("UTC")


@pytest.fixture
async def host(tmp_path: Path, ha_reset: HaInstance) -> AsyncIterator[FarmHost]:
    """The IPC engine with the farm handlers, pointed at the session's HA (every helper at its default)."""
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_reset.env()) as farm:
        yield farm


SHORT_SLICE = timedelta(milliseconds=100)


def _changed_to(ha: HaInstance, entity_id: str, state: str, after: datetime) -> datetime:
    """When HA says `entity_id` changed to `state` (waits for the driven entity to follow its helper)."""

    def seen() -> datetime | None:
        now = ha.get_state(entity_id)
        at = datetime.fromisoformat(now["last_changed"])
        return at if now["state"] == state and at > after else None

    return wait_for(seen, what=f"{entity_id} at {state}", seen=lambda: ha.get_state(entity_id))


async def test_history_summarises_numbers_and_switches_as_they_were_driven(host: FarmHost, ha: HaInstance) -> None:
    begin = datetime.now(UTC)
    times: list[tuple[float, datetime]] = []
    for value in (10.0, 2.0, 6.0):
        ha.set_number(TEMPERATURE, value)
        times.append((value, _changed_to(ha, TEMPERATURE, str(value), times[-1][1] if times else begin)))
    switched: list[datetime] = []
    for turn in ("on", "off", "on", "off"):
        ha.call_service("input_boolean", f"turn_{turn}", {"entity_id": "input_boolean.pump_relay"})
        switched.append(_changed_to(ha, PUMP, turn, switched[-1] if switched else begin))
    end = max(switched[-1], times[-1][1]) + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) > end, what="the end of the period to pass")
    # Just after the first change: the recorder keeps times as floats, so a start equal to the change could fall a
    # hair before it and report the value held before (the farm's start value) at the start.
    start = times[0][1] + timedelta(milliseconds=1)
    params = {
        "entityIds": [TEMPERATURE, PUMP, "switch.no_such_pump"],
        "start": start.isoformat(),
        "end": end.isoformat(),
    }

    async def recorded() -> dict[str, Any] | None:  # the recorder commits every second
        result = ok(await host.ask("main", "ha_history", params))
        return result if result["entities"][PUMP].get("changes") == 4 else None

    result = await wait_for_async(recorded, what="the recorder to hold the pump's four changes")
    assert result["missing"] == ["switch.no_such_pump"]
    temperature = result["entities"][TEMPERATURE]
    spans = [
        (v, max(t, start), (times[i + 1][1] if i + 1 < len(times) else end) - max(t, start))
        for i, (v, t) in enumerate(times)
    ]
    mean = sum(v * d.total_seconds() for v, _, d in spans) / (end - start).total_seconds()
    assert temperature["kind"] == "number"
    assert (temperature["min"], temperature["max"], temperature["last"]) == (2.0, 10.0, 6.0)
    assert temperature["mean"] == pytest.approx(mean, abs=0.01)
    assert [p[1] for p in temperature["points"]] == [10.0, 2.0, 6.0] and temperature["changes"] == 2
    pump = result["entities"][PUMP]
    on_seconds = (switched[1] - switched[0]) + (switched[3] - switched[2])
    assert pump["kind"] == "on_off" and pump["turnedOn"] == 2 and pump["last"] == "off"
    assert pump["onSeconds"] == round(on_seconds.total_seconds())


async def test_history_defaults_to_the_last_day(host: FarmHost, ha: HaInstance) -> None:
    result = ok(await host.ask("main", "ha_history", {"entityIds": [PUMP]}))
    start, end = datetime.fromisoformat(result["start"]), datetime.fromisoformat(result["end"])
    assert end - start == timedelta(hours=24) and abs(datetime.now(UTC) - end) < timedelta(minutes=1)
    assert result["entities"][PUMP]["kind"] == "on_off" and result["missing"] == []


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"entityIds": [PUMP], "start": "yesterday"}, ("'start'", "ISO 8601", "yesterday")),
        ({"entityIds": [PUMP], "end": "06:00 tomorrow"}, ("'end'", "ISO 8601")),
        ({"entityIds": [PUMP], "start": "2026-12-04T10:00Z", "end": "2026-12-04T09:00Z"}, ("'start'", "before 'end'")),
        ({"entityIds": [PUMP], "start": "2026-10-01T00:00Z", "end": "2026-11-15T00:00Z"}, ("45.0 days", "at most 31")),
        ({"entityIds": [PUMP], "start": "2999-01-01T00:00Z"}, ("'start'", "in the future")),
        ({"entityIds": []}, ("'entityIds'", "non-empty")),
        ({"start": "2026-12-04T10:00Z"}, ("missing param 'entityIds'",)),
        ({"entityIds": ["../etc"]}, ("entityIds.0", "entity id")),
        # instants before year 1 or after 9999 in UTC: answered, not a host failure (`internal`)
        ({"entityIds": [PUMP], "end": "0001-01-01T00:00"}, ("'end'", "outside the supported date range")),
        ({"entityIds": [PUMP], "start": "0001-01-01T00:00:00+14:00"}, ("'start'", "outside the supported date range")),
        ({"entityIds": [PUMP], "end": "9999-12-31T23:59:59-14:00"}, ("'end'", "outside the supported date range")),
    ],
)
async def test_history_refuses_bad_periods_naming_the_field(
    host: FarmHost, params: dict[str, Any], words: tuple[str, ...]
) -> None:
    refused(await host.ask("main", "ha_history", params), "invalid_request", "ha_history", *words)


def test_many_changes_are_downsampled_to_time_weighted_slices() -> None:
    start = datetime(2026, 12, 4, tzinfo=UTC)
    end = start + timedelta(hours=24)
    # a value a minute, alternating 0 and 10: every slice's time-weighted mean is 5
    changes = [Change(at=start + timedelta(minutes=m), state=str(10 * (m % 2))) for m in range(24 * 60)]
    summary = summarise(changes, start, end, ZONE)
    assert summary["kind"] == "number" and summary["changes"] == 24 * 60 - 1
    assert len(summary["points"]) == MAX_POINTS and {p[1] for p in summary["points"]} == {5.0}
    assert summary["mean"] == 5.0 and (summary["min"], summary["max"], summary["last"]) == (0.0, 10.0, 10.0)


def test_unavailable_time_is_left_out_of_the_mean_and_the_on_time() -> None:
    start = datetime(2026, 12, 4, tzinfo=UTC)
    end = start + timedelta(hours=4)
    hour = timedelta(hours=1)
    number = summarise(
        [Change(at=start - hour, state="4"), Change(at=start + hour, state="unavailable"),
         Change(at=start + 2 * hour, state="8")],
        start, end, ZONE,
    )  # fmt: skip
    assert number["mean"] == pytest.approx((4 * 1 + 8 * 2) / 3, abs=0.001) and number["unavailableSeconds"] == 3600
    switch = summarise(
        [Change(at=start, state="on"), Change(at=start + hour, state="unavailable"), Change(at=start + 3 * hour, state="on")],
        start, end, ZONE,
    )  # fmt: skip
    assert switch["kind"] == "on_off" and switch["onSeconds"] == 2 * 3600 and switch["turnedOn"] == 0
    assert summarise([], start, end, ZONE) == {"kind": "none", "changes": 0}


def _one_command_changes(raw: Any, entity_id: str) -> list[Change]:
    """What one command for the whole period says (the way ha_history asked before slicing), as changes."""
    rows = raw.get(entity_id, []) if isinstance(raw, dict) else []
    return [Change(at=datetime.fromtimestamp(r.get("lc", r["lu"]), UTC), state=str(r["s"])) for r in rows]


async def test_a_period_fetched_in_slices_is_summarised_as_one_command_for_it_would(
    host: FarmHost, ha: HaInstance
) -> None:
    assert host.ha is not None
    begin = datetime.now(UTC)
    last = begin
    for value in (3.0, 8.0, 5.0, 9.0, 4.0):
        # Changes at least two 0.1 s slices apart, however fast HA follows (a quick machine made them in 0.2 s)
        apart = last + 2 * SHORT_SLICE
        wait_for(lambda: datetime.now(UTC) > apart, what="the next slice")  # noqa: B023 - called within this iteration
        ha.set_number(TEMPERATURE, value)
        last = _changed_to(ha, TEMPERATURE, str(value), last)
    for turn in ("on", "off", "on"):
        ha.call_service("input_boolean", f"turn_{turn}", {"entity_id": "input_boolean.pump_relay"})
        last = max(last, _changed_to(ha, PUMP, turn, last))
    end = last + timedelta(seconds=1)
    wait_for(lambda: datetime.now(UTC) > end, what="the end of the period to pass")
    entities = [TEMPERATURE, PUMP]

    async def whole(start: datetime) -> dict[str, list[Change]] | None:
        raw = await host.ha.ws_command(  # type: ignore[union-attr]
            "history/history_during_period", start_time=start.isoformat(), end_time=end.isoformat(),
            entity_ids=entities, include_start_time_state=True, significant_changes_only=False,
            minimal_response=True, no_attributes=True,
        )  # fmt: skip
        changes = {e: _one_command_changes(raw, e) for e in entities}
        return changes if changes[PUMP] and changes[PUMP][-1].state == "on" else None  # the recorder commits each 1 s

    # a few days (HA's recorder here is younger: the first slices hold nothing), in the default slices
    start = end - timedelta(days=3)
    expected = {e: summarise(c, start, end, ZONE) for e, c in (await wait_for_async(lambda: whole(start))).items()}
    assert expected[TEMPERATURE]["changes"] >= 4 and expected[PUMP]["turnedOn"] >= 2  # and earlier tests'
    assert await entity_summaries(host.ha, entities, start, end, ZONE) == expected
    # the last seconds in slices of 0.1 s, their boundaries between and next to the changes
    start = begin - timedelta(seconds=1)
    expected = {e: summarise(c, start, end, ZONE) for e, c in (await wait_for_async(lambda: whole(start))).items()}
    short = SHORT_SLICE
    slices = [s async for s in history_slices(host.ha, TEMPERATURE, start, end, longest_slice=short)]
    assert len(slices) >= (end - start) / short and sum(1 for s in slices if s) >= 5
    assert summarise([c for s in slices for c in s], start, end, ZONE) == expected[TEMPERATURE]
    assert await entity_summaries(host.ha, entities, start, end, ZONE, longest_slice=short) == expected
