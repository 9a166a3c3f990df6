"""What an entity service does to its entity: the kind of state each one leads to, read both ways.

A rule written by service (`"services": ["light.turn_on"]`) holds the service's effect, not the call's wording:
`light.toggle` may have the effect of `light.turn_on`, and a light seen going on (whatever route: the relay
behind it, a scene) is what `light.turn_on` does. One table says which states each service of a domain leads
to; the gate reads it from a call's service (farm/control/actuator_gate.py; also the one state an approval is
for), the rules on effects from an observed state (farm/control/effect_rules.py), the dashboard policy from a
button's call, and all of them then match the rules the same way (rules.matching). An entity is guarded when a
rule names it or covers a service of its domain's table (`guarding`): that is what `/stop` makes safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from farmhost.farm.control.rules import ActuatorRule, ControlCall, matching
from farmhost.farm.control.safe_state import (
    CLOSE_DOMAINS,
    NUMBER_DOMAINS,
    OFF_DOMAINS,
    SELECT_DOMAINS,
    is_on,
    rules_of,
)

# The action of what no farm action does (a change seen in HA, a dashboard button's call): no farm action's name,
# so only the rules written by service or entity match it.
EFFECT: Final = "(effect)"
ALL_ENTITIES: Final = "all"  # Home Assistant's entity_id for every entity a service's domain has
ON_SERVICES: Final = frozenset({"turn_on", "toggle"})
ON: Final = "on"
OFF: Final = "off"
OPEN: Final = "open"
CLOSED: Final = "closed"
LOCKED: Final = "locked"
UNLOCKED: Final = "unlocked"
VALUE: Final = "value"  # any new number
OPTION: Final = "option"  # any new option

# domain -> service -> the kinds of state the service may lead its entities to.
_LEADS_TO: Final[Mapping[str, Mapping[str, frozenset[str]]]] = {
    **{
        domain: {"turn_on": frozenset({ON}), "turn_off": frozenset({OFF}), "toggle": frozenset({ON, OFF})}
        for domain in OFF_DOMAINS
    },
    **{
        domain: {
            f"open_{domain}": frozenset({OPEN}),
            f"close_{domain}": frozenset({CLOSED}),
            "toggle": frozenset({OPEN, CLOSED}),
            f"set_{domain}_position": frozenset({OPEN, CLOSED}),
        }
        for domain in CLOSE_DOMAINS
    },
    "lock": {"lock": frozenset({LOCKED}), "unlock": frozenset({UNLOCKED}), "open": frozenset({UNLOCKED})},
    "number": {"set_value": frozenset({VALUE})},
    "input_number": {
        "set_value": frozenset({VALUE}),
        "increment": frozenset({VALUE}),
        "decrement": frozenset({VALUE}),
    },
    **{
        domain: {
            "select_option": frozenset({OPTION}),
            "select_next": frozenset({OPTION}),
            "select_previous": frozenset({OPTION}),
            "select_first": frozenset({OPTION}),
            "select_last": frozenset({OPTION}),
        }
        for domain in SELECT_DOMAINS
    },
}


def kind_of(entity_id: str, state: str) -> str | None:
    """The kind of `state` for the entity's domain (on/off, open/closed, a value...), None when no service's."""
    domain = entity_id.split(".", 1)[0]
    if domain in NUMBER_DOMAINS:
        return VALUE
    if domain in SELECT_DOMAINS:
        return OPTION
    on = is_on(entity_id, state)
    if on is None:
        return None
    if domain in OFF_DOMAINS:
        return ON if on else OFF
    if domain in CLOSE_DOMAINS:
        return OPEN if on else CLOSED
    if domain == "lock":
        return UNLOCKED if on else LOCKED
    return None


def services_leading_to(entity_id: str, state: str) -> list[str]:
    """The `domain.service` names whose effect on the entity is this state (light on: turn_on and toggle)."""
    domain = entity_id.split(".", 1)[0]
    kind = kind_of(entity_id, state)
    if kind is None:
        return []
    return [f"{domain}.{service}" for service, kinds in _LEADS_TO.get(domain, {}).items() if kind in kinds]


def same_effect(service: str) -> list[str]:
    """`domain.service` and every service of its domain that may have the same effect (toggle: turn_on, turn_off)."""
    domain, name = service.split(".", 1)
    table = _LEADS_TO.get(domain, {})
    kinds = table.get(name)
    if kinds is None:
        return [service]
    return [service, *(f"{domain}.{other}" for other, led in table.items() if other != name and led & kinds)]


def state_of(service: str) -> str | None:
    """The one state `domain.service` leads its entities to (switch.turn_on: on, lock.lock: locked).

    None when it may lead to several (a toggle), to a value or an option (its data says which), or is not an
    entity service of the table.
    """
    domain, name = service.split(".", 1)
    kinds = _LEADS_TO.get(domain, {}).get(name, frozenset())
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    return None if kind in (VALUE, OPTION) else kind


def service_call(
    action: str, service: str, entities: Iterable[str], *, indirect: bool = False, value: Any = None
) -> ControlCall:
    """A call of `domain.service` on `entities` as the rules see it: covered by any service of the same effect.

    `all` (every entity of the domain, resolved by HA) is as unseen by the rules as an area target (`indirect`).
    """
    named = tuple(entities)
    return ControlCall(
        action=action,
        service=service,
        entities=tuple(entity for entity in named if entity != ALL_ENTITIES),
        indirect=indirect or ALL_ENTITIES in named,
        value=value,
        turns_on=service.split(".", 1)[1] in ON_SERVICES,
        effect_services=tuple(same_effect(service)),
    )


def rules_of_change(rules: Iterable[ActuatorRule], entity_id: str, state: str) -> list[ActuatorRule]:
    """The rules that hold the entity reaching `state`: those naming it, and those written by a service leading there."""
    return _rules_by(tuple(rules), entity_id, services_leading_to(entity_id, state))


def guarding(rules: Iterable[ActuatorRule], entity_id: str) -> list[ActuatorRule]:
    """The rules that guard the entity: those naming it, and those written by any service of its domain's table.

    `{"services": ["light.*"]}` guards every light, `{"services": ["switch.turn_on"]}` every switch: what /stop
    puts in its safe state and a dashboard button may not act on through a helper.
    """
    domain = entity_id.split(".", 1)[0]
    return _rules_by(tuple(rules), entity_id, [f"{domain}.{service}" for service in _LEADS_TO.get(domain, {})])


def guarded(rules: Iterable[ActuatorRule], entity_ids: Iterable[str]) -> list[str]:
    """The entities among `entity_ids` that some rule guards (guarding), sorted."""
    kept = tuple(rules)
    return sorted({entity for entity in entity_ids if guarding(kept, entity)})


def _rules_by(rules: tuple[ActuatorRule, ...], entity_id: str, services: list[str]) -> list[ActuatorRule]:
    """The rules naming the entity, then those covering it by one of `services` (its effects)."""
    found = rules_of(rules, entity_id)
    if services:
        call = ControlCall(action=EFFECT, service=services[0], entities=(entity_id,), effect_services=tuple(services))
        found += [rule for rule in matching(rules, call) if rule not in found]
    return found
