"""The actuator gate: what the farm profile's rules (`policy.rules`) ask of a control action before it runs.

After the group is authorised and the params are valid, a control action is described as a ControlCall (its
service, entities and value, known before anything reaches Home Assistant) and held to the rules that cover it:
targets a rule can see, the value range, the rate (the agents' effects counted in the database by
farm/control/effect_rules.py, so a restart forgets nothing and a call HA refused counts nothing), and approval in the
chat. A call under approval is not run: it answers pending_approval with the approval's id, and runs later once,
when an approver presses Approve (`RequestContext.approved`). Requests that lead to the same
effect share one approval, and a group has at most FARMHOST_MAX_PENDING_APPROVALS waiting.

The safe direction is always open: a call that only puts the entities it names in their safe state
(farm/control/safe_state.py: off, closed, the low end of a range, a rule's safeState) is never held by approval or rate.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from pydantic import BaseModel

from farmhost.errors import NotAllowed, PendingApproval, RateLimited
from farmhost.farm.control import approval_requests as asking
from farmhost.farm.control import effects, reach, rules, safe_state
from farmhost.farm.control.policy import INDIRECT_TARGETS
from farmhost.farm.control.rules import ActuatorRule, ControlCall
from farmhost.farm.core_actions import SWITCH_DOMAINS, service_targets, set_entity_service
from farmhost.farm.homeassistant.errors import HaError, HaNotFound
from farmhost.farm.homeassistant.names import friendly_name
from farmhost.handling import Change
from farmhost.protocol.catalog import CONTROL_ACTIONS
from farmhost.protocol.params import HaCallServiceParams, HaSetEntityParams
from farmhost.store import actuator_calls
from farmhost.store.db import iso

if TYPE_CHECKING:
    import sqlite3
    from datetime import datetime

    from farmhost.farm.control.policy import LoadedProfile
    from farmhost.farm.deps import FarmDeps
    from farmhost.handling import RequestContext

HOUR: Final = timedelta(hours=1)
# entity id -> its attributes as HA reports them (only the guarded numbers a call names)
Attributes: TypeAlias = Mapping[str, Mapping[str, Any]]
# Data keys that only say where a call goes (already in the effect's entities and targets).
_TARGET_KEYS: Final = frozenset({"entity_id", *INDIRECT_TARGETS})


def describe(action: str, params: BaseModel) -> ControlCall | None:
    """The ControlCall of a control action (None for reads); raises InvalidRequest for targets that are not valid."""
    if action not in CONTROL_ACTIONS:
        return None
    if isinstance(params, HaCallServiceParams):
        entities, indirect = service_targets(params)
        value = (params.data or {}).get("value")
        return effects.service_call(
            action, f"{params.domain}.{params.service}", entities, indirect=indirect, value=value
        )
    if isinstance(params, HaSetEntityParams):
        domain = params.entityId.split(".", 1)[0]
        service = f"{domain}.{set_entity_service(params)}"
        return effects.service_call(action, service, (params.entityId,), value=params.value)
    return ControlCall(action=action)


async def reached(deps: FarmDeps, call: ControlCall) -> ControlCall:
    """`call` naming what it reaches: the members of the groups it names (farm/control/reach.py).

    Read from the live view while it follows HA, else from HA; a group farmhost cannot read makes the call
    `indirect` (as an area target: a rule that names entities refuses it).
    """
    if call.service is None or not call.entities or deps.ha is None:
        return call
    ha, view = deps.ha, deps.view
    unreadable = False

    async def attributes(entity: str) -> Mapping[str, Any] | None:
        nonlocal unreadable
        if view is not None and view.connected:
            seen = view.get(entity)
            return seen.attributes if seen is not None else None
        try:
            return (await ha.get_state(entity)).get("attributes") or {}
        except HaNotFound:
            return None
        except HaError:
            unreadable = True
            return None

    entities, overflow = await reach.reached(call.entities, call.service.split(".", 1)[0], attributes)
    if entities == call.entities and not (overflow or unreadable):
        return call
    return dataclasses.replace(call, entities=entities, indirect=call.indirect or overflow or unreadable)


async def attributes_of(deps: FarmDeps, call: ControlCall, under: tuple[ActuatorRule, ...]) -> Attributes:
    """The attributes HA reports for the guarded numbers `call` names: their `min` is the safe state no rule names.

    An entity HA cannot report is left out: its safe state is then unknown, and the call is held as any other.
    """
    found: dict[str, Mapping[str, Any]] = {}
    if deps.ha is None:
        return found
    for entity in call.entities:
        if safe_state.domain_of(entity) not in safe_state.NUMBER_DOMAINS or not safe_state.rules_of(under, entity):
            continue
        try:
            found[entity] = (await deps.ha.get_state(entity)).get("attributes") or {}
        except HaError:
            continue
    return found


async def admit(
    deps: FarmDeps,
    ctx: RequestContext,
    call: ControlCall,
    params: dict[str, Any],
    loaded: LoadedProfile,
    attributes: Attributes,
) -> None:
    """Hold `call` to the rules that cover it: targets, range, the rates counted so far, approval.

    `attributes` are the named entities' attributes (attributes_of), for the safe state of a number.

    Raises:
        NotAllowed: a target the rules cannot see, a value outside a range, an approval nobody could give, or
            an approver the rules do not name (any more).
        RateLimited: a sentence naming the entity, its count and the limit.
        PendingApproval: the call is under approval and not approved yet: asked in the main chat.
    """
    matched = rules.matching(loaded.rules, call)
    if not matched:
        return
    if only_safe(call, params, loaded.rules, attributes):
        return  # the safe direction: never held, and not counted against a rate
    rules.check_targets(matched, call)
    rules.check_value_range(matched, call)
    approval = rules.approval_for(matched)
    if approval is not None:
        _check_approvers(call, approval, matched, ctx)
    if approval is not None and ctx.approved is None:
        with ctx.db.tx() as conn:
            problem = _rate_problem(conn, matched, call, ctx.now)
        if problem is not None:
            raise RateLimited(await _named(deps, *problem))
        with ctx.db.tx() as conn:
            row, again = asking.ask(
                conn,
                folder=ctx.group.folder,
                request_id=ctx.request_id,
                action=call.action,
                params=params,
                summary=summary(call, params),
                approval=approval,
                at=ctx.now,
                effect=effect_of(call, params),
                max_pending=deps.settings.max_pending_approvals,
            )
        if not again:
            ctx.changes.add(Change.OUTBOX)  # the approvers' message: delivered now, not at the outbox's next scan
        waiting = "is still waiting for" if again else "now waits for"
        raise PendingApproval(
            f"{call.action} needs an approval in the farm's main chat (farm profile rules): approval {row.id} "
            f"{waiting} an approver until {row.expires_at:%H:%M} UTC. Nothing was done; the outcome is posted to "
            "this group's chat and given to your next run. Do not ask again meanwhile: the same request gets the "
            "same approval",
            result={"approvalId": row.id, "expiresAt": iso(row.expires_at), "alreadyPending": again},
        )
    with ctx.db.tx() as conn:
        problem = _rate_problem(conn, matched, call, ctx.now)  # the effects are counted by farm/control/effect_rules.py
    if problem is not None:
        raise RateLimited(await _named(deps, *problem))


def _check_approvers(
    call: ControlCall, approval: rules.Approval, matched: list[ActuatorRule], ctx: RequestContext
) -> None:
    """Someone may approve the call under the rules as they are now, and an approved call's approver is among them.

    Raises:
        NotAllowed: the rules' approver lists share no one, or the approver is not (any more) among them.
    """
    if approval.approvers is None:
        return  # any member of the main chat: the desk checked the presser was one
    named = ", ".join(str(user) for user in sorted(approval.approvers))
    if not approval.approvers:
        lists = "; ".join(
            ", ".join(str(user) for user in spec.approvers)
            for rule in matched
            if isinstance(spec := rule.requireApproval, rules.ApprovalRule) and spec.approvers is not None
        )
        raise NotAllowed(
            f"{call.action} needs an approval, and the farm profile rules that cover it name approvers ({lists}) "
            "but no one is in every list, so nobody could approve it. Nothing was done and nobody was asked: the "
            "farmer must fix the approvers in the farm profile's policy.rules"
        )
    approved = ctx.approved
    if approved is not None and approved.user_id not in approval.approvers:
        raise NotAllowed(
            f"{call.action} was approved by {approved.by}, who is not among the approvers the farm profile rules "
            f"name for it now (Telegram user {named}): the profile changed after it was asked. Nothing was done; "
            "ask again if it is still needed"
        )


def only_safe(
    call: ControlCall, params: dict[str, Any], under: tuple[rules.ActuatorRule, ...], attributes: Attributes
) -> bool:
    """The call does nothing but put each entity it names in its safe state (off, closed, the low end, safeState).

    `attributes` are the entities' attributes as HA reports them (attributes_of): a number's `min` is its low end.

    A call that also reaches devices/areas/labels or `all`, names no entity, or calls a service of another domain
    than an entity's is not: what it does to them cannot be stated.
    """
    if call.service is None or call.indirect or not call.entities:
        return False
    domain, service = call.service.split(".", 1)
    for entity in call.entities:
        target = safe_state.safe_target(entity, under, attributes.get(entity))
        if target is None or target.domain != domain or target.service != service:
            return False
        if target.data and not safe_state.is_safe_state(entity, _asked(call, params), under, attributes.get(entity)):
            return False
    return True


def effect_of(call: ControlCall, params: dict[str, Any]) -> dict[str, Any]:
    """What the call leads to, for sharing one approval: the entities and the state asked, not the call's wording.

    `ha_set_entity` on, `switch.turn_on` and a `switch.turn_on` with its data keys reordered or extra keys all lead
    to "this entity on"; a service whose effect is no single state keeps its data (minus the target keys).
    """
    if call.service is None:
        return {"action": call.action, "params": params}
    service = call.service.split(".", 1)[1]
    state: Any = effects.state_of(call.service)
    if state is None and service in ("set_value", "select_option"):
        asked = _asked(call, params)
        number = rules.as_number(asked)
        state = {"value": number if number is not None else asked}
    if state is None:
        data = params.get("data") or {}
        state = {"service": call.service, "data": {k: v for k, v in data.items() if k not in _TARGET_KEYS}}
    reached = {
        key: value
        for part in (params.get("data") or {}, params.get("target") or {})
        for key, value in part.items()
        if key in INDIRECT_TARGETS
    }
    everything = effects.ALL_ENTITIES if call.indirect and not reached else None
    return {"entities": sorted(set(call.entities)), "reached": reached, "all": everything, "state": state}


def _asked(call: ControlCall, params: dict[str, Any]) -> Any:
    """The value or option the call sets (ha_set_entity's value, data.value, data.option)."""
    if call.value is not None:
        return call.value
    return (params.get("data") or {}).get("option")


def summary(call: ControlCall, params: dict[str, Any]) -> str:
    """What the call will do, in words, for the approvers."""
    if call.action == "ha_set_entity":
        return f"set {params.get('entityId')} to {json.dumps(params.get('value'))} ({call.service})"
    if call.service is not None:
        targets = ", ".join(call.entities) or "no entity id (device/area target)"
        data = {k: v for k, v in (params.get("data") or {}).items() if k != "entity_id"}
        shown = f" with data {json.dumps(data, sort_keys=True)}" if data else ""
        return f"call {call.service} on {targets}{shown}"
    if call.action == "ha_assist":
        return f"ask Home Assistant's Assist: {json.dumps(params.get('text'))}"
    return f"run {call.action}"


def _rated(rule: ActuatorRule) -> bool:
    return rule.maxCallsPerHour is not None or rule.minSecondsBetween is not None


def _rate_problem(
    conn: sqlite3.Connection, matched: list[ActuatorRule], call: ControlCall, now: datetime
) -> tuple[str, str] | None:
    """(entity, sentence with `{name}` for its name) of the first rate limit this call would break, or None."""
    for rule in matched:
        if not _rated(rule):
            continue
        for entity in rules.entities_under(rule, call):
            count, latest = actuator_calls.since(conn, entity, now - HOUR)
            verb = "switched" if entity.split(".", 1)[0] in SWITCH_DOMAINS else "set"
            if rule.maxCallsPerHour is not None and count >= rule.maxCallsPerHour:
                return entity, (
                    f"{{name}} was {verb} {count} times in the last hour; the limit is {rule.maxCallsPerHour} "
                    "(farm profile). Nothing was done: try again later or ask the farmer"
                )
            if rule.minSecondsBetween is not None and latest is not None:
                ago = (now - latest).total_seconds()
                if ago < rule.minSecondsBetween:
                    wait = max(1, round(rule.minSecondsBetween - ago))
                    return entity, (
                        f"{{name}} was {verb} {ago:.0f} s ago; the farm profile allows one change every "
                        f"{rule.minSecondsBetween:g} s. Nothing was done: try again in {wait} s"
                    )
    return None


async def _named(deps: FarmDeps, entity: str, sentence: str) -> str:
    """The sentence with the entity's friendly name (and id), or its id alone when HA cannot say."""
    name = entity
    if deps.ha is not None:
        try:
            friendly = friendly_name((await deps.ha.get_state(entity)).get("attributes") or {})
        except HaError:
            friendly = None
        if friendly:
            name = f"the {friendly[0].lower()}{friendly[1:]} ({entity})"
    return sentence.format(name=name)
