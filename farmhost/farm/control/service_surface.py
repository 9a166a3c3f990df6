"""The closed service surface: which Home Assistant services an agent may call by default, and the sentence if not.

By default an agent reaches only the entity services of actuator and helper domains, each with the services whose
effect is a state of the entities it names (on/off, open/closed, a value, an option), addressed to entities.
Everything else (scenes, scripts, automations, `*.reload`, logger, notifications, Assist through a service call...)
is refused unless the farm profile's `policy.allowServices` lists it; `conversation` only ever goes through
`ha_assist`, and the denied domains of farm/control/policy.py stay denied whatever the profile says (checked there first).
The table is HA 2025.4's own service names (`homeassistant/components/<domain>/services.yaml`), with the services
that reach beyond their entities left out (`remote.send_command`, `media_player.play_media` fetching a URL,
`input_select.set_options`, `vacuum.send_command`, `alarm_control_panel.*`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Final

from farmhost.errors import NotAllowed


def _services(names: str) -> frozenset[str]:
    return frozenset(names.split())


_ON_OFF: Final = "turn_on turn_off toggle"
_SELECT: Final = "select_option select_first select_last select_next select_previous"

ENTITY_SERVICES: Final[Mapping[str, frozenset[str]]] = {
    "switch": _services(_ON_OFF),
    "light": _services(_ON_OFF),
    "siren": _services(_ON_OFF),
    "fan": _services(f"{_ON_OFF} set_percentage set_preset_mode oscillate set_direction increase_speed decrease_speed"),
    "valve": _services("open_valve close_valve toggle set_valve_position stop_valve"),
    "cover": _services(
        "open_cover close_cover toggle set_cover_position stop_cover open_cover_tilt close_cover_tilt "
        "toggle_cover_tilt set_cover_tilt_position stop_cover_tilt"
    ),
    "climate": _services(
        f"{_ON_OFF} set_temperature set_humidity set_hvac_mode set_preset_mode set_fan_mode set_swing_mode "
        "set_swing_horizontal_mode set_aux_heat"
    ),
    "humidifier": _services(f"{_ON_OFF} set_mode set_humidity"),
    "water_heater": _services("turn_on turn_off set_temperature set_operation_mode set_away_mode"),
    "lock": _services("lock unlock open"),
    "number": _services("set_value"),
    "select": _services(_SELECT),
    "button": _services("press"),
    "text": _services("set_value"),
    "date": _services("set_value"),
    "time": _services("set_value"),
    "datetime": _services("set_value"),
    "input_boolean": _services(_ON_OFF),
    "input_number": _services("set_value increment decrement"),
    "input_select": _services(_SELECT),
    "input_button": _services("press"),
    "input_text": _services("set_value"),
    "input_datetime": _services("set_datetime"),
    "counter": _services("increment decrement reset set_value"),
    "vacuum": _services(f"{_ON_OFF} start stop pause start_pause return_to_base locate clean_spot"),
    "lawn_mower": _services("start_mowing pause dock"),
    "media_player": _services(
        f"{_ON_OFF} volume_up volume_down volume_set volume_mute media_play media_pause media_play_pause "
        "media_stop media_next_track media_previous_track"
    ),
}
# Assist picks entities and services itself; ha_assist checks what it can reach first (farm/policy.check_assist).
ASSIST_DOMAINS: Final = frozenset({"conversation"})


def in_surface(domain: str, service: str) -> bool:
    """`domain.service` is one of the entity services agents may call without the profile opening it."""
    return service in ENTITY_SERVICES.get(domain, frozenset())


def opened(name: str, allow: Iterable[str]) -> bool:
    """The farm profile's `policy.allowServices` globs open `domain.service`."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allow)


def check_surface(domain: str, service: str, *, allow: Iterable[str]) -> None:
    """Refuse a service outside the closed surface that the farm profile does not open.

    Args:
        domain: the service's domain (not one of the denied domains: those are refused before).
        service: the service name.
        allow: the profile's `policy.allowServices` globs.

    Raises:
        NotAllowed: a sentence saying why and what the operator can do.
    """
    name = f"{domain}.{service}"
    if domain in ASSIST_DOMAINS:
        raise NotAllowed(
            f"{name} is not open to agents as a service call: ask Home Assistant's Assist with ha_assist, which "
            "first checks what Assist can reach against the farm profile"
        )
    if in_surface(domain, service) or opened(name, allow):
        return
    raise NotAllowed(
        f"{name} is not one of the services agents may call (the entity services of switches, lights, valves, "
        "covers, numbers, selects, helpers and the like, addressed to entities); the operator can open it by "
        f'adding "{name}" (or a glob such as "{domain}.*") to the farm profile\'s policy.allowServices'
    )


def check_addressed(domain: str, service: str, *, targeted: bool, allow: Iterable[str]) -> None:
    """Refuse an entity service of the surface that names no target (unless the profile opens it as it is).

    Raises:
        NotAllowed: naming the service and how to target it.
    """
    name = f"{domain}.{service}"
    if not targeted and not opened(name, allow):
        raise NotAllowed(f"{name} must be addressed to entities: give target.entity_id")
