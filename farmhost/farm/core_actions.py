"""The core Home Assistant farm actions: ha_get_status, ha_call_service, ha_set_entity and ha_restart."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import InvalidRequest, Unavailable
from farmhost.farm.control import policy
from farmhost.farm.homeassistant.client import HaRejected
from farmhost.protocol.codes import ENTITY_ID_RE
from farmhost.protocol.params import HaCallServiceParams, HaGetStatusParams, HaSetEntityParams, NoParams

if TYPE_CHECKING:
    from pydantic import BaseModel

    from farmhost.farm.control.policy import LoadedProfile
    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext

# On a Raspberry Pi HA takes 30-90 s to restart; the action's own timeout (actions.py) is above this.
RESTART_TIMEOUT: Final = 150.0
# A driven entity (a template number/select following its helper) reflects a change a moment after the call.
READ_BACK_SECONDS: Final = 3.0
STATE_KEYS: Final = ("entity_id", "state", "attributes", "last_changed", "last_updated")
TARGET_KEYS: Final = ("entity_id", *policy.INDIRECT_TARGETS)

NUMBER_DOMAINS: Final = frozenset({"input_number", "number"})
SWITCH_DOMAINS: Final = frozenset({"input_boolean", "switch", "light", "fan"})
SELECT_DOMAINS: Final = frozenset({"input_select", "select"})
SETTABLE_DOMAINS: Final = NUMBER_DOMAINS | SWITCH_DOMAINS | SELECT_DOMAINS
ON_WORDS: Final = frozenset({"on", "true", "1", "yes"})
OFF_WORDS: Final = frozenset({"off", "false", "0", "no"})
INT64: Final = (-(2**63), 2**64 - 1)  # the integers HA's JSON reader (orjson) takes


async def ha_get_status(deps: FarmDeps, ctx: RequestContext, p: HaGetStatusParams) -> dict[str, Any]:
    """Current states, all or filtered: `{entityIds?, domains?}` (an entity matching either filter is kept).

    Returns:
        `{states: [{entity_id, state, attributes, last_changed, last_updated}], count, missing}`; `missing`
        lists requested entity ids HA does not know (reported, not an error).

    Raises:
        InvalidRequest: unknown params, or an entity id / domain that is not a valid name.
    """
    states = await require_ha(deps).get_states()
    wanted_ids = set(p.entityIds or ())
    wanted_domains = set(p.domains or ())
    if p.entityIds is None and p.domains is None:
        kept = states
    else:
        kept = [s for s in states if s.get("entity_id") in wanted_ids or _domain(s) in wanted_domains]
    known = {s.get("entity_id") for s in states}
    kept = sorted(kept, key=lambda s: str(s.get("entity_id")))
    return {
        "states": [_state(s) for s in kept],
        "count": len(kept),
        "missing": sorted(wanted_ids - known),
    }


async def ha_call_service(deps: FarmDeps, ctx: RequestContext, p: HaCallServiceParams) -> dict[str, Any]:
    """Call a service: `{domain, service, data?, target?}` (the service policy was checked before: check_calls).

    Returns:
        `{service: "domain.service", changedStates: [...]}`: the states the call changed, as HA reports them.

    Raises:
        InvalidRequest: bad params. NotAllowed: a denied domain or outside the farm profile.
        NotFound: HA has no such service. HaRejected: HA refused the data (its sentence is kept).
    """
    data, target = dict(p.data or {}), dict(p.target or {})
    _check_integers(data, "data")
    try:
        changed = await require_ha(deps).call_service(p.domain, p.service, data, target=target or None)
    except HaRejected as err:  # HA refused the data: the agent's request was invalid, HA's sentence says why
        raise InvalidRequest(err.message) from None
    return {"service": f"{p.domain}.{p.service}", "changedStates": [_state(s) for s in changed]}


async def ha_set_entity(deps: FarmDeps, ctx: RequestContext, p: HaSetEntityParams) -> dict[str, Any]:
    """Set one entity to a value: `{entityId, value}`, through the service its domain uses.

    input_number/number: a number within the entity's min/max (set_value). input_boolean/switch/light/fan:
    true/false, on/off, 1/0, yes/no in any case (turn_on/turn_off). input_select/select: one of its options
    (select_option).

    Returns:
        `{entityId, service, requested, state, confirmed}`: `state` is read back from HA afterwards and
        `confirmed` says whether it shows the requested value.

    Raises:
        InvalidRequest: another domain, or a value the entity cannot take (the message gives the range or the
        options). NotFound: HA has no such entity. NotAllowed: outside the farm profile.
    """
    domain = p.entityId.split(".", 1)[0]
    service = set_entity_service(p)
    ha = require_ha(deps)
    current = await ha.get_state(p.entityId)
    data, expected = _plan(p.entityId, domain, p.value, current.get("attributes") or {})
    try:
        await ha.call_service(domain, service, {"entity_id": p.entityId, **data})
    except HaRejected as err:
        raise InvalidRequest(err.message) from None
    state = await _read_back(ha, p.entityId, expected)
    return {
        "entityId": p.entityId,
        "service": f"{domain}.{service}",
        "requested": p.value,
        "state": _state(state),
        "confirmed": _shows(state.get("state"), expected),
    }


async def ha_restart(deps: FarmDeps, ctx: RequestContext, p: NoParams) -> dict[str, Any]:
    """Restart HA through its API (homeassistant.restart) and wait until it is RUNNING again.

    Returns:
        `{restarted: true, seconds}`: how long HA took from the request to RUNNING.

    Raises:
        Unavailable: HA is not RUNNING (it would ignore the restart). HaTimeout: not back in time.
    """
    seconds = await require_ha(deps).restart(timeout=RESTART_TIMEOUT)
    return {"restarted": True, "seconds": round(seconds, 1)}


def check_calls(params: BaseModel, loaded: LoadedProfile) -> None:
    """The service policy of the service an ha_call_service or ha_set_entity call would call (others: nothing).

    Checked before the actuator rules (farm/control/actuator_gate.py), so a call that could never run asks nobody for approval.

    Raises:
        InvalidRequest: bad targets, or a value ha_set_entity cannot set. NotAllowed: the sentence of the policy.
    """
    if isinstance(params, HaCallServiceParams):
        entity_ids, indirect = service_targets(params)
        policy.check_service(params.domain, params.service, entity_ids, indirect=indirect, loaded=loaded)
    elif isinstance(params, HaSetEntityParams):
        domain = params.entityId.split(".", 1)[0]
        service = set_entity_service(params)
        policy.check_service(domain, service, [params.entityId], indirect=False, loaded=loaded)


def service_targets(p: HaCallServiceParams) -> tuple[list[str], bool]:
    """The entity ids a service call names, and whether it also targets devices, areas, floors or labels.

    Entity ids come from data.entity_id and target.entity_id; the others HA resolves on its side.

    Raises:
        InvalidRequest: an unknown target key, or an entity id that is not one.
    """
    data, target = p.data or {}, p.target or {}
    unknown = sorted(set(target) - set(TARGET_KEYS))
    if unknown:
        raise InvalidRequest(f"target may only hold {', '.join(TARGET_KEYS)} (got {', '.join(unknown)})")
    entity_ids = _entity_ids(data.get("entity_id"), "data.entity_id") + _entity_ids(
        target.get("entity_id"), "target.entity_id"
    )
    return entity_ids, any(key in data or key in target for key in policy.INDIRECT_TARGETS)


def set_entity_service(p: HaSetEntityParams) -> str:
    """The service ha_set_entity calls for this entity and value (set_value, turn_on/turn_off, select_option).

    Raises:
        InvalidRequest: a domain ha_set_entity does not set, or a switch value that is not on/off.
    """
    domain = p.entityId.split(".", 1)[0]
    if domain not in SETTABLE_DOMAINS:
        raise InvalidRequest(
            f"ha_set_entity cannot set {domain} entities; it sets {', '.join(sorted(SETTABLE_DOMAINS))}. "
            f"Use ha_call_service for {p.entityId}"
        )
    return _service_for(domain, p.value, p.entityId)


# helpers ---------------------------------------------------------------------------------------------


def require_ha(deps: FarmDeps) -> HAClient:
    """The HA client, or Unavailable with what the operator sets when HA is not configured."""
    if deps.ha is None:
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    return deps.ha


def _entity_ids(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise InvalidRequest(f"{where} must be an entity id or a list of entity ids")
    bad = [v for v in values if v != "all" and not _valid_entity_id(v)]
    if bad:
        raise InvalidRequest(f"{where}: {bad[0]!r} is not a valid entity id (lower-case domain.object_id)")
    return list(values)


def _valid_entity_id(value: str) -> bool:
    return ENTITY_ID_RE.fullmatch(value) is not None


def _service_for(domain: str, value: Any, entity_id: str) -> str:
    if domain in NUMBER_DOMAINS:
        return "set_value"
    if domain in SWITCH_DOMAINS:
        return "turn_on" if _switch(value, entity_id) else "turn_off"
    return "select_option"


def _plan(entity_id: str, domain: str, value: Any, attrs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(service data, the state to expect) for setting `entity_id` to `value`, checked against its attributes."""
    if domain in NUMBER_DOMAINS:
        number = _number(value, entity_id)
        low, high = attrs.get("min"), attrs.get("max")
        if isinstance(low, int | float) and isinstance(high, int | float) and not low <= number <= high:
            raise InvalidRequest(f"{entity_id} takes values from {low:g} to {high:g}; {number:g} is outside that range")
        return {"value": number}, number
    if domain in SWITCH_DOMAINS:
        return {}, "on" if _switch(value, entity_id) else "off"
    options = attrs.get("options")
    option = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    if not isinstance(options, list) or option not in options:
        listed = ", ".join(repr(o) for o in options) if isinstance(options, list) else "none listed"
        raise InvalidRequest(f"{entity_id} takes one of its options: {listed} (got {value!r})")
    return {"option": option}, option


def _number(value: Any, entity_id: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequest(f"{entity_id} takes a number, not {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InvalidRequest(f"{entity_id} takes a number, not {_shown(value)}") from None
    except OverflowError:  # an integer past the largest float
        number = math.inf
    if not math.isfinite(number):
        raise InvalidRequest(f"{entity_id} takes a finite number, not {_shown(value)}")
    return number


def _check_integers(value: Any, where: str) -> None:
    """Every integer in the service data fits 64 bits: HA's JSON reader drops the connection on a larger one.

    Raises:
        InvalidRequest: naming where the integer is.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            _check_integers(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_integers(item, f"{where}[{index}]")
    elif isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        raise InvalidRequest(f"{where} is {_shown(value)}: Home Assistant takes integers of at most 64 bits")


def _shown(value: Any) -> str:
    """The value as the agent sent it, cut short (a 400-digit number is not repeated back whole)."""
    text = repr(value) if not isinstance(value, int) else str(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def _switch(value: Any, entity_id: str) -> bool:
    if isinstance(value, bool):
        word = "true" if value else "false"
    elif isinstance(value, int | float) and value in (0, 1):
        word = str(int(value))
    else:
        word = value.strip().lower() if isinstance(value, str) else repr(value)
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise InvalidRequest(f"{entity_id} is switched with true/false, on/off, 1/0 or yes/no (got {value!r})")


async def _read_back(ha: HAClient, entity_id: str, expected: Any) -> dict[str, Any]:
    deadline = time.monotonic() + READ_BACK_SECONDS
    state = await ha.get_state(entity_id)
    while not _shows(state.get("state"), expected) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        state = await ha.get_state(entity_id)
    return state


def _shows(state: Any, expected: Any) -> bool:
    if isinstance(expected, float):
        try:
            return math.isclose(float(state), expected, rel_tol=1e-9, abs_tol=1e-6)
        except (TypeError, ValueError):
            return False
    return bool(state == expected)


def _state(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: raw.get(key) for key in STATE_KEYS}


def _domain(state: dict[str, Any]) -> str:
    return str(state.get("entity_id", "")).split(".", 1)[0]
