"""The alert rules and their lifecycle as tables: HA states in, alerts out (pure, no Home Assistant needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from farmhost.farm.state.alerts import (
    EVENT_ALERT_HOLD,
    Alert,
    AlertBook,
    AlertThresholds,
    Rule,
    Severity,
    alert_id,
    evaluate,
    local_iso,
    reconcile,
    temperature_celsius,
    with_event_alert,
)

NOW = datetime(2026, 5, 17, 3, 0, tzinfo=UTC)
EARLIER = "2026-05-17T02:40:00+00:00"  # HA's last_changed: 20 minutes before NOW
JUST_NOW = "2026-05-17T02:58:00+00:00"  # 2 minutes before NOW
T = AlertThresholds()


def state(entity_id: str, value: str, *, last_changed: str = EARLIER, **attributes: Any) -> dict[str, Any]:
    return {"entity_id": entity_id, "state": value, "attributes": attributes, "last_changed": last_changed}


def temp(value: str, unit: str | None = "°C", **kw: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"device_class": "temperature", "friendly_name": "Air temperature", **kw}
    if unit is not None:
        attrs["unit_of_measurement"] = unit
    return state("sensor.air_temperature", value, **attrs)


def soil(value: str, unit: str | None = "%") -> dict[str, Any]:
    attrs: dict[str, Any] = {"device_class": "moisture", "friendly_name": "Field 1 soil moisture"}
    if unit is not None:
        attrs["unit_of_measurement"] = unit
    return state("sensor.field_1_soil_moisture", value, **attrs)


def binary(entity_id: str, value: str, device_class: str | None, *, last_changed: str = EARLIER) -> dict[str, Any]:
    attrs = {"device_class": device_class} if device_class else {}
    return state(entity_id, value, last_changed=last_changed, friendly_name=entity_id.split(".")[1], **attrs)


# (case, states, thresholds, expected [(rule, entity, severity, since-from-HA?)])
RULE_TABLE: list[tuple[str, list[dict[str, Any]], AlertThresholds, list[tuple[Rule, str, Severity, bool]]]] = [
    ("warm air: nothing", [temp("14.5")], T, []),
    ("frost risk below 2 °C", [temp("1.5")], T, [(Rule.FROST, "sensor.air_temperature", Severity.WARNING, False)]),
    ("exactly the threshold: no alert", [temp("2")], T, []),
    ("frost at 0 °C is critical", [temp("0")], T, [(Rule.FROST, "sensor.air_temperature", Severity.CRITICAL, False)]),
    ("deep frost", [temp("-7.5")], T, [(Rule.FROST, "sensor.air_temperature", Severity.CRITICAL, False)]),
    ("°F converted: 34 °F = 1.1 °C", [temp("34", "°F")], T, [(Rule.FROST, "sensor.air_temperature", Severity.WARNING, False)]),
    ("°F converted: 40 °F = 4.4 °C", [temp("40", "°F")], T, []),
    ("kelvin converted", [temp("272.15", "K")], T, [(Rule.FROST, "sensor.air_temperature", Severity.CRITICAL, False)]),
    ("no unit: °C assumed", [temp("1", None)], T, [(Rule.FROST, "sensor.air_temperature", Severity.WARNING, False)]),
    ("a unit that is no temperature", [temp("1", "%")], T, []),
    ("custom frost threshold", [temp("3.5")], AlertThresholds(frost_celsius=4), [(Rule.FROST, "sensor.air_temperature", Severity.WARNING, False)]),
    ("unavailable temperature: no frost", [temp("unavailable", last_changed=JUST_NOW)], T, []),
    ("unknown temperature: no frost", [temp("unknown")], T, []),
    ("nan is not a number", [temp("nan")], T, []),
    ("a humidity sensor is not a thermometer", [state("sensor.air_humidity", "1", device_class="humidity", unit_of_measurement="%")], T, []),
    ("input_number is no sensor", [state("input_number.air_temperature_raw", "-3", unit_of_measurement="°C")], T, []),
    ("cold binary sensor on", [binary("binary_sensor.frost_risk", "on", "cold")], T, [(Rule.FROST, "binary_sensor.frost_risk", Severity.CRITICAL, True)]),
    ("cold binary sensor off", [binary("binary_sensor.frost_risk", "off", "cold")], T, []),
    ("problem on", [binary("binary_sensor.pump_fault", "on", "problem")], T, [(Rule.PROBLEM, "binary_sensor.pump_fault", Severity.WARNING, True)]),
    ("problem off", [binary("binary_sensor.pump_fault", "off", "problem")], T, []),
    ("on without a device class", [binary("binary_sensor.door", "on", None)], T, []),
    ("smoke on", [binary("binary_sensor.barn_smoke", "on", "smoke")], T, [(Rule.SAFETY, "binary_sensor.barn_smoke", Severity.CRITICAL, True)]),
    ("gas on", [binary("binary_sensor.biogas", "on", "gas")], T, [(Rule.SAFETY, "binary_sensor.biogas", Severity.CRITICAL, True)]),
    ("soil at 45 %", [soil("45")], T, []),
    ("soil below 25 %", [soil("12.5")], T, [(Rule.SOIL_MOISTURE_LOW, "sensor.field_1_soil_moisture", Severity.WARNING, False)]),
    ("soil exactly 25 %", [soil("25")], T, []),
    ("soil threshold configurable", [soil("30")], AlertThresholds(soil_low_percent=35), [(Rule.SOIL_MOISTURE_LOW, "sensor.field_1_soil_moisture", Severity.WARNING, False)]),
    ("soil without a unit", [soil("10", None)], T, [(Rule.SOIL_MOISTURE_LOW, "sensor.field_1_soil_moisture", Severity.WARNING, False)]),
    ("soil in another unit is not judged", [soil("10", "kPa")], T, []),
    ("sensor unavailable for 20 min", [state("sensor.field_2_soil_moisture", "unavailable")], T, [(Rule.UNAVAILABLE, "sensor.field_2_soil_moisture", Severity.WARNING, True)]),
    ("sensor unavailable for 2 min: grace", [state("sensor.field_2_soil_moisture", "unavailable", last_changed=JUST_NOW)], T, []),
    ("grace configurable", [state("sensor.field_2_soil_moisture", "unavailable", last_changed=JUST_NOW)], AlertThresholds(unavailable_minutes=1), [(Rule.UNAVAILABLE, "sensor.field_2_soil_moisture", Severity.WARNING, True)]),
    ("binary sensor unavailable", [binary("binary_sensor.pump_fault", "unavailable", "problem")], T, [(Rule.UNAVAILABLE, "binary_sensor.pump_fault", Severity.WARNING, True)]),
    ("a switch unavailable is no sensor", [state("switch.irrigation_pump", "unavailable")], T, []),
    ("unknown is not unavailable", [state("sensor.field_2_soil_moisture", "unknown")], T, []),
    ("ignored entity", [soil("5")], AlertThresholds(ignored_entities=frozenset({"sensor.field_1_soil_moisture"})), []),
    ("garbage is skipped", [{"entity_id": 5}, {"state": "on"}, {"entity_id": "sensor.x", "state": None, "attributes": None}], T, []),
    (
        "several at once, most urgent first",
        [soil("10"), temp("-1"), binary("binary_sensor.pump_fault", "on", "problem"), binary("binary_sensor.frost_risk", "on", "cold")],
        T,
        [
            (Rule.FROST, "binary_sensor.frost_risk", Severity.CRITICAL, True),
            (Rule.FROST, "sensor.air_temperature", Severity.CRITICAL, False),
            (Rule.PROBLEM, "binary_sensor.pump_fault", Severity.WARNING, True),
            (Rule.SOIL_MOISTURE_LOW, "sensor.field_1_soil_moisture", Severity.WARNING, False),
        ],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "states", "thresholds", "expected"), RULE_TABLE, ids=[r[0] for r in RULE_TABLE])
def test_rules(
    case: str,
    states: list[dict[str, Any]],
    thresholds: AlertThresholds,
    expected: list[tuple[Rule, str, Severity, bool]],
) -> None:
    alerts = evaluate(states, thresholds, NOW)
    assert [(a.rule, a.entity_id, a.severity) for a in alerts] == [e[:3] for e in expected]
    changed = {s.get("entity_id"): s.get("last_changed") for s in states}
    for alert, (_, _, _, since_from_ha) in zip(alerts, expected, strict=True):
        # a binary sensor or an outage began when HA says the state changed; a threshold crossing when first seen
        assert alert.since == (datetime.fromisoformat(changed[alert.entity_id]) if since_from_ha else NOW)
        assert alert.resolved_at is None
        assert alert.id == f"{alert.rule}:{alert.entity_id}:{int(alert.since.timestamp())}"
        assert alert.message


MESSAGE_TABLE = [
    (temp("1.5"), "Frost risk: Air temperature is 1.5 °C, below 2 °C"),
    (temp("34", "°F"), "Frost risk: Air temperature is 34 °F, below 2 °C"),
    (soil("12.5"), "Soil moisture low: Field 1 soil moisture is 12.5 %, below 25 %"),
    (binary("binary_sensor.frost_risk", "on", "cold"), "Frost: frost_risk reports cold"),
    (binary("binary_sensor.pump_fault", "on", "problem"), "Problem reported by pump_fault"),
    (binary("binary_sensor.barn_co", "on", "carbon_monoxide"), "Carbon monoxide detected by barn_co"),
    (state("sensor.probe", "unavailable"), "sensor.probe is unavailable (Home Assistant has no data from it)"),
]


@pytest.mark.parametrize(("entity", "message"), MESSAGE_TABLE)
def test_messages_name_the_entity_and_value(entity: dict[str, Any], message: str) -> None:
    [alert] = evaluate([entity], T, NOW)
    assert alert.message == message


@pytest.mark.parametrize(
    ("value", "unit", "celsius"),
    [
        (20.0, "°C", 20.0),
        (20.0, None, 20.0),
        (32.0, "°F", 0.0),
        (212.0, "°F", 100.0),
        (273.15, "K", 0.0),
        (1.0, "%", None),
    ],
)
def test_temperature_conversion(value: float, unit: str | None, celsius: float | None) -> None:
    result = temperature_celsius(value, unit)
    assert result == pytest.approx(celsius) if celsius is not None else result is None


def _book(*alerts: Alert, resolved: tuple[Alert, ...] = ()) -> AlertBook:
    return AlertBook(active=alerts, resolved=resolved)


def test_reconcile_keeps_the_original_since_and_id_and_updates_the_message() -> None:
    first = reconcile(AlertBook(), evaluate([soil("20")], T, NOW), [soil("20")], NOW, keep_resolved=10)
    later = NOW + timedelta(minutes=30)
    second = reconcile(first, evaluate([soil("15")], T, later), [soil("15")], later, keep_resolved=10)
    [was], [now] = first.active, second.active
    assert (now.id, now.since) == (was.id, NOW)
    assert "15 %" in now.message and "20 %" in was.message
    assert second.resolved == ()


def test_reconcile_resolves_what_cleared_newest_first_and_keeps_the_last_n() -> None:
    book = AlertBook()
    moments = [NOW + timedelta(hours=h) for h in range(6)]
    for i, moment in enumerate(moments):
        states = [soil("10" if i % 2 == 0 else "40")]  # low, ok, low, ok, ...
        book = reconcile(book, evaluate(states, T, moment), states, moment, keep_resolved=2)
    assert book.active == ()
    assert [a.resolved_at for a in book.resolved] == [moments[5], moments[3]]
    assert [a.since for a in book.resolved] == [moments[4], moments[2]]
    assert len({a.id for a in book.resolved}) == 2  # each occurrence has its own id


def test_reconcile_holds_an_alert_while_its_entity_has_no_data() -> None:
    book = reconcile(AlertBook(), evaluate([soil("10")], T, NOW), [soil("10")], NOW, keep_resolved=5)
    for placeholder in ("unavailable", "unknown"):
        states = [{**soil(placeholder), "last_changed": JUST_NOW}]  # within the unavailability grace
        held = reconcile(book, evaluate(states, T, NOW), states, NOW + timedelta(minutes=1), keep_resolved=5)
        assert held.active == book.active and held.resolved == ()
    gone = reconcile(book, [], [], NOW + timedelta(minutes=1), keep_resolved=5)  # the entity was removed from HA
    assert gone.active == () and gone.resolved[0].resolved_at == NOW + timedelta(minutes=1)


def test_reconcile_resolves_an_unavailable_alert_when_data_returns() -> None:
    down = [state("sensor.probe", "unavailable")]
    book = reconcile(AlertBook(), evaluate(down, T, NOW), down, NOW, keep_resolved=5)
    assert [a.rule for a in book.active] == [Rule.UNAVAILABLE]
    back = [state("sensor.probe", "unknown", last_changed=NOW.isoformat())]
    book = reconcile(book, evaluate(back, T, NOW), back, NOW, keep_resolved=5)
    assert book.active == () and [a.rule for a in book.resolved] == [Rule.UNAVAILABLE]


def test_alerts_round_trip_in_the_farm_time_zone() -> None:
    zone = ZoneInfo("Asia/Kolkata")
    book = reconcile(AlertBook(), evaluate([soil("10")], T, NOW), [soil("10")], NOW, keep_resolved=5)
    later = NOW + timedelta(hours=1)
    book = reconcile(book, evaluate([temp("1")], T, later), [soil("40"), temp("1")], later, keep_resolved=5)
    doc = book.to_json(zone)
    assert doc["active"][0]["since"] == "2026-05-17T09:30:00+05:30"
    assert doc["resolved"][0]["resolvedAt"] == "2026-05-17T09:30:00+05:30"
    assert set(doc["resolved"][0]) == {"id", "rule", "entityId", "severity", "message", "since", "resolvedAt"}
    assert AlertBook.from_json(doc) == book
    assert local_iso(NOW, ZoneInfo("UTC")) == "2026-05-17T03:00:00+00:00"  # an offset, never "Z"


@pytest.mark.parametrize(
    "doc",
    [None, [], {"active": []}, {"active": {}, "resolved": []}, "text"],
)
def test_a_document_that_is_not_an_alert_book_is_refused(doc: Any) -> None:
    with pytest.raises(TypeError):
        AlertBook.from_json(doc)


def test_entries_that_are_not_alerts_are_dropped() -> None:
    good = reconcile(AlertBook(), evaluate([soil("10")], T, NOW), [soil("10")], NOW, keep_resolved=5)
    entry = good.to_json(ZoneInfo("UTC"))["active"][0]
    bad = [
        1,
        {**entry, "rule": "volcano"},
        {**entry, "severity": "meh"},
        {**entry, "since": "yesterday"},
        {**entry, "since": "2026-05-17T03:00:00"},  # no offset
        {k: v for k, v in entry.items() if k != "entityId"},
        {**entry, "resolvedAt": "2026-05-17T04:00:00+00:00"},  # resolved, in the active list
    ]
    book = AlertBook.from_json({"active": [*bad, entry], "resolved": [entry]})  # active, in the resolved list
    assert book == good


def _violation(at: datetime, message: str = "farmhost undid a change of the pump") -> Alert:
    pump = "switch.irrigation_pump"
    return Alert(
        id=alert_id(Rule.VIOLATION, pump, at),
        rule=Rule.VIOLATION,
        entity_id=pump,
        severity=Severity.CRITICAL,
        message=message,
        since=at,
    )


def test_a_violation_alert_stays_active_for_its_hold_whatever_the_states_then_resolves() -> None:
    book = with_event_alert(AlertBook(), _violation(NOW))
    again = with_event_alert(book, _violation(NOW + timedelta(minutes=5), "again"))  # the latest replaces it
    assert [a.message for a in again.active] == ["again"]
    held = reconcile(again, [], [], NOW + timedelta(minutes=30), keep_resolved=5)  # no state raises it: held
    assert held.active == again.active
    later = NOW + timedelta(minutes=5) + EVENT_ALERT_HOLD
    gone = reconcile(held, [], [], later, keep_resolved=5)
    assert gone.active == () and gone.resolved[0].rule is Rule.VIOLATION and gone.resolved[0].resolved_at == later
