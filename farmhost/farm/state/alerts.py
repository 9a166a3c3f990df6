"""Farm alert rules: pure functions from Home Assistant states, thresholds and a time to alerts and their lifecycle."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Any, Final

from farmhost.config import AlertThresholds
from farmhost.farm.homeassistant.names import friendly_name

# HA's placeholders for "no value": a rule never fires on them, and an alert is held (not resolved) while its
# entity shows one, so an HA restart (every entity briefly `unavailable`) does not resolve and re-raise alerts.
NO_DATA_STATES: Final = frozenset({"unavailable", "unknown"})
# Binary sensor classes whose `on` means danger to people or animals, not merely a fault.
SAFETY_CLASSES: Final = frozenset({"smoke", "gas", "carbon_monoxide", "safety"})
CELSIUS_UNITS: Final = frozenset({"°C", "C", "℃"})
FAHRENHEIT_UNITS: Final = frozenset({"°F", "F", "℉"})


class Severity(StrEnum):
    """How urgent an alert is; active alerts are listed most urgent first."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class Rule(StrEnum):
    """The alert rules (an alert's `rule`)."""

    FROST = "frost"
    PROBLEM = "problem"
    SAFETY = "safety"
    SOIL_MOISTURE_LOW = "soil_moisture_low"
    UNAVAILABLE = "unavailable"
    VIOLATION = "violation"  # raised by an event (farm/control/effect_rules.py), not by a state: see EVENT_ALERT_HOLD


# An event alert (a violation undone) stays active this long after its last occurrence, then resolves: long
# enough for the farmer to see it on the dashboard and in MQTT, short enough not to become noise.
EVENT_ALERT_HOLD: Final = timedelta(hours=1)
_SEVERITY_ORDER: Final = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert: a rule firing for one entity from `since` until `resolved_at` (None while active)."""

    id: str
    rule: Rule
    entity_id: str
    severity: Severity
    message: str
    since: datetime
    resolved_at: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What makes two alerts the same condition: the rule and the entity."""
        return (self.rule, self.entity_id)

    def to_json(self, zone: tzinfo) -> dict[str, Any]:
        """The alert as written to farm-state files, dates in the farm's time zone."""
        doc: dict[str, Any] = {
            "id": self.id,
            "rule": self.rule.value,
            "entityId": self.entity_id,
            "severity": self.severity.value,
            "message": self.message,
            "since": local_iso(self.since, zone),
        }
        if self.resolved_at is not None:
            doc["resolvedAt"] = local_iso(self.resolved_at, zone)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Alert:
        """Read an alert written by `to_json`.

        Raises:
            ValueError: the document is not an alert (wrong keys, types, rule, severity or dates).
        """
        try:
            resolved = doc.get("resolvedAt")
            alert = cls(
                id=str(doc["id"]),
                rule=Rule(doc["rule"]),
                entity_id=str(doc["entityId"]),
                severity=Severity(doc["severity"]),
                message=str(doc["message"]),
                since=_aware(datetime.fromisoformat(doc["since"])),
                resolved_at=_aware(datetime.fromisoformat(resolved)) if resolved is not None else None,
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not an alert: {err!r}") from None
        return alert


@dataclass(frozen=True, kw_only=True)
class AlertBook:
    """Active alerts (most urgent first) and the most recently resolved ones (newest first)."""

    active: tuple[Alert, ...] = ()
    resolved: tuple[Alert, ...] = ()

    def to_json(self, zone: tzinfo) -> dict[str, Any]:
        """The `alerts.json` document."""
        return {"active": [a.to_json(zone) for a in self.active], "resolved": [a.to_json(zone) for a in self.resolved]}

    @classmethod
    def from_json(cls, doc: Any) -> AlertBook:
        """Read `alerts.json`; entries that are not alerts are dropped.

        Raises:
            TypeError: the document is not an object with `active` and `resolved` lists.
        """
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("active"), list)
            or not isinstance(doc.get("resolved"), list)
        ):
            raise TypeError("alerts.json must be an object with `active` and `resolved` lists")
        return cls(
            active=_read_alerts(doc["active"], active=True), resolved=_read_alerts(doc["resolved"], active=False)
        )


def local_iso(moment: datetime, zone: tzinfo) -> str:
    """ISO-8601 in the farm's time zone with its offset (never `Z`), to the second."""
    return moment.astimezone(zone).isoformat(timespec="seconds")


def evaluate(states: Iterable[Mapping[str, Any]], thresholds: AlertThresholds, now: datetime) -> list[Alert]:
    """Every alert the rules raise for these states at `now` (each with `since` = when its condition began, if known).

    Args:
        states: raw HA state dicts ({entity_id, state, attributes, last_changed, ...}).
        thresholds: the operator's thresholds.
        now: an aware datetime.

    Returns:
        New alerts, at most one per rule and entity; `reconcile` merges them with the alerts already known.
    """
    found: dict[tuple[str, str], Alert] = {}
    for state in states:
        entity_id = state.get("entity_id")
        if not isinstance(entity_id, str) or entity_id in thresholds.ignored_entities:
            continue
        for rule in RULES:
            alert = rule(entity_id, state, thresholds, now)
            if alert is not None:
                found.setdefault(alert.key, alert)
    return _ordered(found.values())


def reconcile(
    book: AlertBook,
    fresh: Iterable[Alert],
    states: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    keep_resolved: int,
) -> AlertBook:
    """Merge the alerts raised now into the known ones.

    An alert already active stays active with its original `id` and `since` (its message is updated); a new one is
    added; an active alert whose condition is gone is resolved at `now`, except while its entity shows no data
    (`unavailable`/`unknown`), when it is held as it is.

    Args:
        book: the alerts known before this evaluation.
        fresh: `evaluate`'s result for `states`.
        states: the raw states the alerts were evaluated on.
        now: the evaluation time (the `resolvedAt` of what resolves).
        keep_resolved: how many resolved alerts to keep (newest first).
    """
    raised = {alert.key: alert for alert in fresh}
    current = {s.get("entity_id"): str(s.get("state")) for s in states}
    active: list[Alert] = []
    newly_resolved: list[Alert] = []
    for old in book.active:
        new = raised.pop(old.key, None)
        if old.rule is Rule.VIOLATION:
            if now - old.since < EVENT_ALERT_HOLD:
                active.append(old)
            else:
                newly_resolved.append(replace(old, resolved_at=now))
            continue
        if new is not None:
            active.append(replace(old, severity=new.severity, message=new.message))
        elif old.rule is not Rule.UNAVAILABLE and current.get(old.entity_id) in NO_DATA_STATES:
            active.append(old)
        else:
            newly_resolved.append(replace(old, resolved_at=now))
    active.extend(raised.values())
    resolved = (*newly_resolved, *book.resolved)[: max(keep_resolved, 0)]
    return AlertBook(active=tuple(_ordered(active)), resolved=resolved)


def with_event_alert(book: AlertBook, alert: Alert) -> AlertBook:
    """The book with an event alert raised (one of the same rule and entity is replaced: the latest counts)."""
    kept = [a for a in book.active if a.key != alert.key]
    return replace(book, active=tuple(_ordered([*kept, alert])))


def alert_id(rule: Rule, entity_id: str, since: datetime) -> str:
    """An id unique to one occurrence: the same condition raised again later gets a new id."""
    return f"{rule.value}:{entity_id}:{int(since.timestamp())}"


def temperature_celsius(value: float, unit: str | None) -> float | None:
    """The value in °C, or None for a unit that is not a temperature (°C is assumed when HA gives none)."""
    if unit is None or unit in CELSIUS_UNITS:
        return value
    if unit in FAHRENHEIT_UNITS:
        return (value - 32.0) * 5.0 / 9.0
    if unit == "K":
        return value - 273.15
    return None


def _frost(entity_id: str, state: Mapping[str, Any], t: AlertThresholds, now: datetime) -> Alert | None:
    attrs = _attributes(state)
    name = _name(entity_id, attrs)
    if _domain(entity_id) == "binary_sensor" and attrs.get("device_class") == "cold" and state.get("state") == "on":
        return _alert(Rule.FROST, entity_id, Severity.CRITICAL, f"Frost: {name} reports cold", _changed(state, now))
    if _domain(entity_id) != "sensor" or attrs.get("device_class") != "temperature":
        return None
    value = _number(state)
    unit = attrs.get("unit_of_measurement")
    celsius = temperature_celsius(value, unit if isinstance(unit, str) else None) if value is not None else None
    if celsius is None or celsius >= t.frost_celsius:
        return None
    severity = Severity.CRITICAL if celsius <= 0.0 else Severity.WARNING
    shown = f"{value:g} {unit}" if isinstance(unit, str) else f"{value:g} °C"
    message = f"Frost risk: {name} is {shown}, below {t.frost_celsius:g} °C"
    return _alert(Rule.FROST, entity_id, severity, message, now)


def _problem(entity_id: str, state: Mapping[str, Any], t: AlertThresholds, now: datetime) -> Alert | None:
    attrs = _attributes(state)
    if _domain(entity_id) != "binary_sensor" or attrs.get("device_class") != "problem" or state.get("state") != "on":
        return None
    message = f"Problem reported by {_name(entity_id, attrs)}"
    return _alert(Rule.PROBLEM, entity_id, Severity.WARNING, message, _changed(state, now))


def _safety(entity_id: str, state: Mapping[str, Any], t: AlertThresholds, now: datetime) -> Alert | None:
    attrs = _attributes(state)
    device_class = attrs.get("device_class")
    if _domain(entity_id) != "binary_sensor" or device_class not in SAFETY_CLASSES or state.get("state") != "on":
        return None
    what = str(device_class).replace("_", " ")
    message = f"{what.capitalize()} detected by {_name(entity_id, attrs)}"
    return _alert(Rule.SAFETY, entity_id, Severity.CRITICAL, message, _changed(state, now))


def _soil_moisture_low(entity_id: str, state: Mapping[str, Any], t: AlertThresholds, now: datetime) -> Alert | None:
    attrs = _attributes(state)
    if _domain(entity_id) != "sensor" or attrs.get("device_class") != "moisture":
        return None
    if attrs.get("unit_of_measurement") not in (None, "%"):
        return None
    value = _number(state)
    if value is None or value >= t.soil_low_percent:
        return None
    message = f"Soil moisture low: {_name(entity_id, attrs)} is {value:g} %, below {t.soil_low_percent:g} %"
    return _alert(Rule.SOIL_MOISTURE_LOW, entity_id, Severity.WARNING, message, now)


def _unavailable(entity_id: str, state: Mapping[str, Any], t: AlertThresholds, now: datetime) -> Alert | None:
    if _domain(entity_id) not in ("sensor", "binary_sensor") or state.get("state") != "unavailable":
        return None
    since = _changed(state, now)
    if now - since < timedelta(minutes=t.unavailable_minutes):
        return None
    message = f"{_name(entity_id, _attributes(state))} is unavailable (Home Assistant has no data from it)"
    return _alert(Rule.UNAVAILABLE, entity_id, Severity.WARNING, message, since)


RuleFunction = Callable[[str, Mapping[str, Any], AlertThresholds, datetime], "Alert | None"]
# The rule table: adding a rule means adding a function and a row.
RULES: Final[tuple[RuleFunction, ...]] = (_frost, _problem, _safety, _soil_moisture_low, _unavailable)


def _alert(rule: Rule, entity_id: str, severity: Severity, message: str, since: datetime) -> Alert:
    return Alert(
        id=alert_id(rule, entity_id, since),
        rule=rule,
        entity_id=entity_id,
        severity=severity,
        message=message,
        since=since,
    )


def _ordered(alerts: Iterable[Alert]) -> list[Alert]:
    return sorted(alerts, key=lambda a: (_SEVERITY_ORDER[a.severity], a.since, a.rule.value, a.entity_id))


def _read_alerts(items: list[Any], *, active: bool) -> tuple[Alert, ...]:
    alerts: list[Alert] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        try:
            alert = Alert.from_json(item)
        except ValueError:
            continue
        if (alert.resolved_at is None) == active:
            alerts.append(alert)
    return tuple(alerts)


def _attributes(state: Mapping[str, Any]) -> Mapping[str, Any]:
    attrs = state.get("attributes")
    return attrs if isinstance(attrs, Mapping) else {}


def _domain(entity_id: str) -> str:
    return entity_id.partition(".")[0]


def _name(entity_id: str, attrs: Mapping[str, Any]) -> str:
    return friendly_name(attrs) or entity_id


def _number(state: Mapping[str, Any]) -> float | None:
    raw = state.get("state")
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _changed(state: Mapping[str, Any], now: datetime) -> datetime:
    """When HA says the state last changed (capped at `now`); `now` when it does not say."""
    raw = state.get("last_changed")
    if not isinstance(raw, str):
        return now
    try:
        changed = _aware(datetime.fromisoformat(raw))
    except ValueError:
        return now
    return min(changed, now)


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("a date without a UTC offset")
    return moment
