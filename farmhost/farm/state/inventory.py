"""`devices.json` and `calendar.json` fetched from HA, and the entities of `current.json`, shaped for agents."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from zoneinfo import ZoneInfo

from farmhost.farm.homeassistant.client import HaError
from farmhost.farm.state.alerts import NO_DATA_STATES, local_iso

if TYPE_CHECKING:
    from farmhost.farm.homeassistant.client import HAClient

DEVICES: Final = "devices.json"
CALENDAR: Final = "calendar.json"
REGISTRY_COMMANDS: Final = ("config/area_registry/list", "config/device_registry/list", "config/entity_registry/list")


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """A document to write (None: keep the last file) and what is missing from it, if anything (for the log)."""

    document: dict[str, Any] | None
    problem: str | None = None


async def fetch_devices(ha: HAClient, states: list[dict[str, Any]], *, now: datetime, zone: ZoneInfo) -> Fetched:
    """Areas and devices from HA's registries (WebSocket), or entity-derived when they cannot be read."""
    try:
        registries = [await ha.ws_command(command) for command in REGISTRY_COMMANDS]
    except HaError as err:
        problem = f"HA registries unavailable ({err.message}); {DEVICES} is entity-derived"
        return Fetched(document=devices_document(states, None, now=now, zone=zone), problem=problem)
    return Fetched(document=devices_document(states, registries, now=now, zone=zone))


async def fetch_calendar(
    ha: HAClient, states: list[dict[str, Any]], *, now: datetime, zone: ZoneInfo, days: int
) -> Fetched:
    """Every calendar entity's events from `now` to `days` ahead (HA's `calendar.get_events` service)."""
    calendars = sorted(s["entity_id"] for s in states if s["entity_id"].startswith("calendar."))
    # Right after HA starts, a calendar is restored as `unavailable` until its integration has loaded, and HA would
    # refuse the whole query: ask only the loaded ones, and keep the last file while none is.
    current = {s["entity_id"]: s.get("state") for s in states}
    ready = [c for c in calendars if current[c] not in NO_DATA_STATES]
    if calendars and not ready:
        return Fetched(document=None, problem=f"no calendar loaded yet; {CALENDAR} kept as it was")
    end = now + timedelta(days=days)
    doc: dict[str, Any] = {
        "generatedAt": local_iso(now, zone),
        "start": local_iso(now, zone),
        "end": local_iso(end, zone),
        "calendars": calendars,
        "events": [],
    }
    if not calendars:
        doc["note"] = "Home Assistant has no calendar entity; add one (e.g. Local Calendar) to see events here"
        return Fetched(document=doc)
    try:
        result = await ha.ws_command(
            "call_service",
            domain="calendar",
            service="get_events",
            target={"entity_id": ready},
            service_data={"start_date_time": now.isoformat(), "end_date_time": end.isoformat()},
            return_response=True,
        )
    except HaError as err:
        return Fetched(document=None, problem=f"calendar events unavailable ({err.message}); {CALENDAR} kept as it was")
    doc["events"] = calendar_events(result, zone)
    return Fetched(document=doc)


def devices_document(
    states: list[dict[str, Any]], registries: list[Any] | None, *, now: datetime, zone: ZoneInfo
) -> dict[str, Any]:
    """The `devices.json` document: areas and devices from HA's registries, else entity-derived (by domain only).

    Args:
        states: the current states; only entities that have a state are listed.
        registries: the results of the area, device and entity registry list commands, or None.
        now: generation time.
        zone: the farm's time zone.
    """
    known = sorted(s["entity_id"] for s in states)
    domains: dict[str, list[str]] = {}
    for entity_id in known:
        domains.setdefault(entity_id.partition(".")[0], []).append(entity_id)
    doc: dict[str, Any] = {"generatedAt": local_iso(now, zone), "source": "states", "areas": [], "devices": []}
    if registries is None or not all(isinstance(r, list) for r in registries):
        doc["note"] = "Home Assistant's registries could not be read; entities are grouped by domain only"
        doc["withoutArea"] = known
        doc["domains"] = domains
        return doc
    areas_raw, devices_raw, entities_raw = ([item for item in r if isinstance(item, dict)] for r in registries)
    device_area = {d.get("id"): d.get("area_id") for d in devices_raw}
    entity_device: dict[str, Any] = {}
    entity_area: dict[str, Any] = {}
    for entry in entities_raw:
        entity_id = entry.get("entity_id")
        if isinstance(entity_id, str) and entry.get("disabled_by") is None:
            entity_device[entity_id] = entry.get("device_id")
            entity_area[entity_id] = entry.get("area_id") or device_area.get(entry.get("device_id"))
    present = set(known)
    doc["source"] = "registry"
    doc["areas"] = [
        {
            "id": area.get("area_id"),
            "name": area.get("name"),
            "entities": [e for e in known if entity_area.get(e) == area.get("area_id")],
        }
        for area in sorted(areas_raw, key=lambda a: str(a.get("name")))
    ]
    doc["devices"] = [
        {
            "id": device.get("id"),
            "name": device.get("name_by_user") or device.get("name"),
            "manufacturer": device.get("manufacturer"),
            "model": device.get("model"),
            "areaId": device.get("area_id"),
            "entities": sorted(e for e, d in entity_device.items() if d == device.get("id") and e in present),
        }
        for device in sorted(devices_raw, key=lambda d: str(d.get("name_by_user") or d.get("name")))
        if device.get("disabled_by") is None
    ]
    doc["withoutArea"] = [e for e in known if entity_area.get(e) is None]
    doc["domains"] = domains
    return doc


def calendar_events(result: Any, zone: ZoneInfo) -> list[dict[str, Any]]:
    """Flatten a `calendar.get_events` service response into events sorted by start, times in the farm's zone.

    All-day events keep their plain dates (`2026-12-01`) and say `allDay: true`.
    """
    response = result.get("response") if isinstance(result, dict) else None
    events: list[dict[str, Any]] = []
    if not isinstance(response, dict):
        return events
    for calendar, body in response.items():
        items = body.get("events") if isinstance(body, dict) else None
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, dict) or not isinstance(item.get("start"), str):
                continue
            all_day = len(item["start"]) == 10  # HA gives plain dates for all-day events
            event: dict[str, Any] = {"calendar": calendar, "summary": item.get("summary"), "allDay": all_day}
            for key in ("start", "end"):
                event[key] = local_time(item.get(key), zone)
            for key in ("description", "location"):
                if item.get(key):
                    event[key] = item[key]
            events.append(event)
    return sorted(events, key=lambda e: (str(e["start"]), str(e["calendar"])))


def local_time(value: Any, zone: ZoneInfo) -> Any:
    """An HA timestamp string in the farm's time zone; plain dates and anything unreadable pass through unchanged."""
    if not isinstance(value, str) or len(value) == 10:
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    return local_iso(moment, zone) if moment.tzinfo is not None else value


def entities_document(states: list[dict[str, Any]], zone: ZoneInfo) -> dict[str, dict[str, Any]]:
    """`current.json`'s entities: {entity_id: {state, unit, deviceClass, friendlyName, lastChanged}}, sorted by id."""
    entities: dict[str, dict[str, Any]] = {}
    for state in sorted(states, key=lambda s: str(s["entity_id"])):
        attrs = state.get("attributes")
        attrs = attrs if isinstance(attrs, dict) else {}
        entities[state["entity_id"]] = {
            "state": state.get("state"),
            "unit": attrs.get("unit_of_measurement"),
            "deviceClass": attrs.get("device_class"),
            "friendlyName": attrs.get("friendly_name"),
            "lastChanged": local_time(state.get("last_changed"), zone),
        }
    return entities
