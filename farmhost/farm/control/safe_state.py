"""The safe state of a guarded entity: what "off" means for it, and the call that puts it there.

A guarded entity is one that a rule of the farm profile names by an entity glob, or covers by a service of its
domain (farm/control/effects.py `guarding`). Its safe state is the naming rule's `safeState` when one is given,
else its domain's own: off for switch-like domains, closed for valves and covers, locked for locks, the low end of
the naming rule's `valueRange` (else the entity's `min`) for numbers. Selects and buttons have none unless the
rule names one. The gate never holds a call to the safe state (approval, rate), the
enforcer never undoes a change to it, and `/stop` puts every guarded entity in it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from farmhost.farm.control.rules import ActuatorRule, as_number, covers_entity

# Domains whose entities are on or off, and are safe off (turn_off puts them there).
OFF_DOMAINS: Final = frozenset(
    {"switch", "light", "fan", "input_boolean", "humidifier", "siren", "water_heater", "climate", "media_player"}
)
# Domains whose entities open and close, and are safe closed.
CLOSE_DOMAINS: Final = frozenset({"valve", "cover"})
NUMBER_DOMAINS: Final = frozenset({"number", "input_number"})
SELECT_DOMAINS: Final = frozenset({"select", "input_select"})
# The states an entity of a domain is "on" in (what maxOnSeconds times); every other domain: "on".
ON_STATES: Final[Mapping[str, frozenset[str]]] = {
    "valve": frozenset({"open", "opening"}),
    "cover": frozenset({"open", "opening"}),
    "lock": frozenset({"unlocked", "unlocking", "open", "opening"}),
    "climate": frozenset({"heat", "cool", "heat_cool", "auto", "dry", "fan_only"}),
}
DEFAULT_ON_STATES: Final = frozenset({"on"})
UNKNOWN_STATES: Final = frozenset({"unavailable", "unknown"})
# The service that puts an entity of a domain in a given state, for the states that have one.
_STATE_SERVICES: Final[Mapping[str, Mapping[str, str]]] = {
    **{domain: {"off": "turn_off", "on": "turn_on"} for domain in OFF_DOMAINS},
    "valve": {"closed": "close_valve", "open": "open_valve"},
    "cover": {"closed": "close_cover", "open": "open_cover"},
    "lock": {"locked": "lock", "unlocked": "unlock"},
}
_DOMAIN_SAFE: Final[Mapping[str, str]] = {
    **{domain: "off" for domain in OFF_DOMAINS},
    **{domain: "closed" for domain in CLOSE_DOMAINS},
    "lock": "locked",
}


@dataclass(frozen=True, kw_only=True)
class SafeTarget:
    """The safe state of one entity, and the Home Assistant service call that puts it there."""

    entity_id: str
    state: str | float  # a number for number/input_number entities, else the state string
    domain: str
    service: str
    data: dict[str, Any] = field(default_factory=dict)  # besides entity_id (value, option)


def domain_of(entity_id: str) -> str:
    """The domain part of an entity id."""
    return entity_id.split(".", 1)[0]


def is_on(entity_id: str, state: object) -> bool | None:
    """Whether `state` is an on-state of the entity's domain (None: HA does not know it: unavailable/unknown)."""
    if not isinstance(state, str) or state in UNKNOWN_STATES:
        return None
    return state in ON_STATES.get(domain_of(entity_id), DEFAULT_ON_STATES)


def rules_of(rules: Iterable[ActuatorRule], entity_id: str) -> list[ActuatorRule]:
    """The rules that name this entity by an entity glob (the ones that guard it)."""
    return [rule for rule in rules if covers_entity(rule, entity_id)]


def guarded_patterns(rules: Iterable[ActuatorRule]) -> list[str]:
    """Every entity glob of the rules (for matching entities HA does not list yet)."""
    return sorted({glob for rule in rules for glob in rule.entities or ()})


def matches_any(entity_id: str, patterns: Iterable[str]) -> bool:
    """The entity id matches one of the globs."""
    return any(fnmatch.fnmatchcase(entity_id, pattern) for pattern in patterns)


def safe_target(
    entity_id: str, rules: Iterable[ActuatorRule], attributes: Mapping[str, Any] | None = None
) -> SafeTarget | None:
    """The safe state of `entity_id` under the rules that name it, or None when it has none (a select, a button).

    Args:
        entity_id: the entity.
        rules: the profile's rules (only those naming the entity count).
        attributes: the entity's attributes as HA reports them (a number's `min` when no range is given).
    """
    domain = domain_of(entity_id)
    mine = rules_of(rules, entity_id)
    named = next((rule.safeState for rule in mine if rule.safeState is not None), None)
    if domain in NUMBER_DOMAINS:
        value = _number_safe(named, mine, attributes or {})
        if value is None:
            return None
        return SafeTarget(entity_id=entity_id, state=value, domain=domain, service="set_value", data={"value": value})
    if domain in SELECT_DOMAINS:
        if named is None:
            return None
        option = str(named)
        return SafeTarget(
            entity_id=entity_id, state=option, domain=domain, service="select_option", data={"option": option}
        )
    state = str(named) if named is not None else _DOMAIN_SAFE.get(domain)
    service = _STATE_SERVICES.get(domain, {}).get(state) if state is not None else None
    if state is None or service is None:
        return None
    return SafeTarget(entity_id=entity_id, state=state, domain=domain, service=service)


def is_safe_state(
    entity_id: str, state: object, rules: Iterable[ActuatorRule], attributes: Mapping[str, Any] | None = None
) -> bool:
    """`state` (as HA reports it, or a value asked for) is the entity's safe state."""
    target = safe_target(entity_id, rules, attributes)
    if target is None:
        return False
    if isinstance(target.state, float):
        number = as_number(state)
        return number is not None and abs(number - target.state) < 1e-9
    return isinstance(state, str) and state.strip().lower() == target.state.lower()


def _number_safe(named: str | float | None, mine: list[ActuatorRule], attributes: Mapping[str, Any]) -> float | None:
    if named is not None:
        return as_number(named)
    lows = [float(rule.valueRange[0]) for rule in mine if rule.valueRange is not None]
    if lows:
        return max(lows)  # the low end of every range the entity is under
    return as_number(attributes.get("min"))
