"""The entities a service call reaches through the ones it names: the members of the groups among them.

Home Assistant replaces a `group.*` entity id in an entity service call with the group's members (its `entity_id`
attribute, recursively: helpers/group.py `expand_entity_ids`) and acts on those of the service's domain; a group
helper of a domain (a switch, light, fan, cover or valve group) passes the call it gets on to its members, in the
call's own context. The gate (farm/control/actuator_gate.py) judges a call on what it reaches, so a group holding a
guarded pump is held as the pump is (approval, rate, range, the safe direction) before anything is switched, not run
and undone afterwards. A `group.*` id is left out of what a call of another domain reaches (HA does not act on it);
members of another domain than the service's are left out too (HA's service acts on its own domain only).
Assist (farm/assist.py) picks the service itself: what an entity exposed to it reaches is every member, of every
domain, of the groups and scenes among them (a scene lists the entities it sets in the same attribute).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import Any, Final, cast

from farmhost.farm.control.safe_state import domain_of

OLD_GROUP_DOMAIN: Final = "group"
# Entities looked at at most for one call (named and members): past it the call is not judged by name (`indirect`).
MAX_LOOKED_AT: Final = 1000

# entity id -> its attributes as Home Assistant reports them; None when HA does not know the entity.
Lookup = Callable[[str], Awaitable[Mapping[str, Any] | None]]


async def reached(named: Iterable[str], service_domain: str | None, attributes: Lookup) -> tuple[tuple[str, ...], bool]:
    """(the entities a call of `service_domain` on `named` acts on, whether some could not be followed).

    At most MAX_LOOKED_AT entities are looked at: each may cost a request to Home Assistant.

    Args:
        named: the entity ids the call names (without `all`).
        service_domain: the domain of the service called; None for whatever service each entity takes (Assist):
            every entity named and every member, of any domain, is reached.
        attributes: how to read an entity's attributes (None: HA does not know it).
    """
    walk = _walk(named, service_domain, MAX_LOOKED_AT)
    asked = _next(walk, None)
    while isinstance(asked, str):
        asked = _next(walk, await attributes(asked))
    return asked


def reached_now(
    named: Iterable[str], service_domain: str | None, attributes: Callable[[str], Mapping[str, Any] | None]
) -> tuple[tuple[str, ...], bool]:
    """`reached` with attributes already at hand (the live view's states, a read of every state): no limit."""
    walk = _walk(named, service_domain, None)
    asked = _next(walk, None)
    while isinstance(asked, str):
        asked = _next(walk, attributes(asked))
    return asked


_Walk = Generator[str, Mapping[str, Any] | None, tuple[tuple[str, ...], bool]]


def _next(walk: _Walk, attributes: Mapping[str, Any] | None) -> str | tuple[tuple[str, ...], bool]:
    """The walk's next entity to read, or what it found (sends `attributes` for the entity it last asked)."""
    try:
        return walk.send(attributes)
    except StopIteration as done:
        return cast("tuple[tuple[str, ...], bool]", done.value)


def _walk(named: Iterable[str], service_domain: str | None, limit: int | None) -> _Walk:
    """The walk of `reached`: yields each entity whose attributes it needs, and is sent them."""
    found: list[str] = []
    seen: set[str] = set()
    queue = deque(dict.fromkeys(named))
    named_set = set(queue)
    while queue:
        entity = queue.popleft()
        if entity in seen:
            continue
        seen.add(entity)
        if limit is not None and len(seen) > limit:
            return tuple(found), True
        domain = domain_of(entity)
        any_service = service_domain is None
        expanded = not any_service and domain == OLD_GROUP_DOMAIN and service_domain != OLD_GROUP_DOMAIN
        if not expanded and (any_service or entity in named_set or domain == service_domain):
            found.append(entity)
        if not (expanded or any_service or domain == service_domain):
            continue  # HA passes nothing on through an entity it does not act on
        members = _members((yield entity))
        queue.extend(member for member in members if member not in seen)
    return tuple(found), False


def _members(attributes: Mapping[str, Any] | None) -> list[str]:
    """A group's members (its `entity_id` attribute), lower case as HA reads them; none for another entity."""
    listed = (attributes or {}).get("entity_id")
    if isinstance(listed, str):
        listed = [listed]
    if not isinstance(listed, list):
        return []
    return [member.strip().lower() for member in listed if isinstance(member, str) and "." in member]
