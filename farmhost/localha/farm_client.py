"""Driving and checking the simulated farm through HA's API: set-up after start, helpers, reset, Assist exposure."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime

from farmhost.localha.client import HaClient
from farmhost.localha.errors import HaSetupError
from farmhost.localha.farm_entities import (
    ASSIST_ALIASES,
    CALENDAR_ENTITY,
    CALENDAR_NAME,
    DRIVERS,
    FARM_DEFAULTS,
    FARM_ENTITIES,
    SIM_DOMAINS,
)


class FarmClient(HaClient):
    """An HA client that knows the simulated farm: what a person does to it, and what makes it a farm at all."""

    def log_tail(self, lines: int = 40) -> str:
        """What HA logged last, for error messages; a bare client has no log (HaInstance reads hass.log)."""
        return ""

    def setup_farm(self) -> None:
        """Create what YAML cannot: the local calendar (config flow) with two events; then check every entity."""
        flow = self.api("POST", "/api/config/config_entries/flow", {"handler": "local_calendar"})
        done = self.api("POST", f"/api/config/config_entries/flow/{flow['flow_id']}", {"calendar_name": CALENDAR_NAME})
        if done.get("type") != "create_entry":
            raise HaSetupError(f"local_calendar config flow did not create an entry: {done}")
        self.wait_entities([CALENDAR_ENTITY], timeout=10)
        now = int(time.time())
        for summary, start_in_h, hours in (("Irrigate field 1", 2, 1), ("Fertigation (bloom)", 26, 2)):
            self.call_service(
                "calendar",
                "create_event",
                {
                    "entity_id": CALENDAR_ENTITY,
                    "summary": summary,
                    "start_date_time": _local_iso(now + start_in_h * 3600),
                    "end_date_time": _local_iso(now + (start_in_h + hours) * 3600),
                },
            )
        self.check_entities()
        self.expose_to_assist()

    def expose_to_assist(self) -> None:
        """Expose the farm's own entities (not the sim helpers) to Assist, with the aliases farmers say (ASSIST_ALIASES).

        HA exposes only some domains by default (switch, light, fan, not moisture sensors, numbers or selects), so
        "what is the soil moisture of field 1" would find nothing without this.
        """
        exposed = [e.entity_id for e in FARM_ENTITIES if e.entity_id.split(".", 1)[0] not in SIM_DOMAINS]
        with self.ws() as ws:
            answer = ws.command(
                "homeassistant/expose_entity", assistants=["conversation"], entity_ids=exposed, should_expose=True
            )
            if not answer.get("success"):
                raise HaSetupError(f"exposing the farm to Assist failed: {answer.get('error')}")
            for entity_id, aliases in ASSIST_ALIASES.items():
                answer = ws.command("config/entity_registry/update", entity_id=entity_id, aliases=list(aliases))
                if not answer.get("success"):
                    raise HaSetupError(f"setting the Assist aliases of {entity_id} failed: {answer.get('error')}")

    def wait_entities(self, entity_ids: list[str], *, timeout: float) -> None:
        """Wait until HA has all these entities."""
        deadline = time.monotonic() + timeout
        while missing := sorted(set(entity_ids) - {s["entity_id"] for s in self.get_states()}):
            if time.monotonic() > deadline:
                raise HaSetupError(f"entities missing after {timeout} s: {missing}\n{self.log_tail()}")
            time.sleep(0.1)

    def hide_from_assist(self, entity_ids: list[str]) -> None:
        """Un-expose these entities from Assist (the demo does it for those its farm profile limits)."""
        if not entity_ids:
            return
        with self.ws() as ws:
            answer = ws.command(
                "homeassistant/expose_entity", assistants=["conversation"], entity_ids=entity_ids, should_expose=False
            )
            if not answer.get("success"):
                raise HaSetupError(f"un-exposing {', '.join(entity_ids)} from Assist failed: {answer.get('error')}")

    def check_entities(self) -> None:
        """Fail loudly, listing every farm entity that is missing or has the wrong device_class/unit."""
        states = {s["entity_id"]: s for s in self.get_states()}
        problems = []
        for entity in FARM_ENTITIES:
            state = states.get(entity.entity_id)
            if state is None:
                problems.append(f"{entity.entity_id}: missing")
                continue
            attrs = state["attributes"]
            if entity.device_class is not None and attrs.get("device_class") != entity.device_class:
                problems.append(f"{entity.entity_id}: device_class {attrs.get('device_class')!r}")
            if entity.unit is not None and attrs.get("unit_of_measurement") != entity.unit:
                problems.append(f"{entity.entity_id}: unit {attrs.get('unit_of_measurement')!r}")
            if state["state"] in ("unavailable", "unknown") and not entity.entity_id.startswith("calendar."):
                problems.append(f"{entity.entity_id}: state {state['state']!r}")
        if problems:
            raise HaSetupError(
                "the farm configuration is incomplete:\n  " + "\n  ".join(problems) + "\n" + self.log_tail()
            )

    # ---- what a person does

    def set_number(self, entity_id: str, value: float) -> None:
        """input_number/number set_value; a driven sensor id (sensor.air_temperature...) sets its input_number."""
        entity_id = DRIVERS.get(entity_id, entity_id)
        self.call_service(entity_id.split(".", 1)[0], "set_value", {"entity_id": entity_id, "value": value})

    def set_state(self, entity_id: str, value: bool | float | str) -> None:
        """Drive an entity through its service, the way a person would (driven entities go through their helper).

        input_number/number: set_value; input_boolean/switch/light/fan: True/False or "on"/"off";
        input_select/select: the option. For anything else use `write_state` (raw state machine write).
        """
        entity_id = DRIVERS.get(entity_id, entity_id)
        domain = entity_id.split(".", 1)[0]
        if domain in ("input_number", "number"):
            self.set_number(entity_id, float(value))
        elif domain in ("input_boolean", "switch", "light", "fan"):
            on = value if isinstance(value, bool) else str(value).lower() == "on"
            self.call_service(domain, "turn_on" if on else "turn_off", {"entity_id": entity_id})
        elif domain in ("input_select", "select"):
            self.call_service(domain, "select_option", {"entity_id": entity_id, "option": str(value)})
        else:
            raise ValueError(f"set_state does not drive {domain} entities; use write_state")

    def reset(self) -> None:
        """Put every helper back to its start value (FARM_DEFAULTS), so each test sees the same farm."""
        found = self.get_states()
        # Scenes a test made with scene.create (no `id`: not from the configuration) would stay, exposed to Assist.
        for scene in found:
            if scene["entity_id"].startswith("scene.") and "id" not in (scene.get("attributes") or {}):
                self.call_service("scene", "delete", {"entity_id": scene["entity_id"]})
        states = {s["entity_id"]: s["state"] for s in found}
        for entity_id, value in FARM_DEFAULTS.items():
            current = states.get(entity_id)
            if current is not None and _same(current, value):
                continue
            self.set_state(entity_id, value)


def _same(current: str, wanted: float | str) -> bool:
    if isinstance(wanted, float):
        with contextlib.suppress(ValueError):
            return float(current) == wanted
        return False
    return current == wanted


def _local_iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).astimezone().replace(microsecond=0).isoformat()
