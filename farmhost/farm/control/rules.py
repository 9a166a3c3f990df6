"""Actuator rules of the farm profile (`policy.rules`): their format, which calls they match, and the pure checks.

A rule names what it covers (entity globs, `domain.service` globs, or farm action names) and what it asks of
those: approval in the chat, a longest time on, a rate, a range of values. The checks that need no state live
here (value range, targets a rule cannot see); the rate (farm/limits.py), the approval (approvals/) and the
automatic off (farm/control/auto_off.py) keep their state in the database.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Annotated, Any, Final, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag, model_validator

from farmhost.errors import NotAllowed
from farmhost.protocol.catalog import FarmActionName

DEFAULT_EXPIRES_MINUTES: Final = 10
MAX_RULES: Final = 200

_EntityGlob = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_*?]+\.[a-z0-9_*?]+$", max_length=255)]
_ServiceGlob = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_*?]+\.[a-z0-9_*?]+$", max_length=128)]
_TelegramUserId = Annotated[int, Field(ge=1, le=2**53)]


class ApprovalRule(BaseModel):
    """`requireApproval` as an object: who may approve, and how long a request waits for them."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    approvers: Annotated[list[_TelegramUserId], Field(min_length=1, max_length=100)] | None = None
    # 0.05 (3 s) is the shortest: a test's; a farm asks for minutes.
    expiresMinutes: Annotated[int | float, Field(ge=0.05, le=24 * 60)] = DEFAULT_EXPIRES_MINUTES


def _approval_kind(value: Any) -> str:
    return "object" if isinstance(value, dict | ApprovalRule) else "bool"


# Told apart by the value's type, so a mistake inside the object is reported as itself, not as "not a boolean".
_RequireApproval = Annotated[
    Annotated[bool, Tag("bool")] | Annotated[ApprovalRule, Tag("object")], Discriminator(_approval_kind)
]


class ActuatorRule(BaseModel):
    """One entry of `policy.rules`; unknown keys are refused (a typo must not leave a pump unguarded)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    entities: Annotated[list[_EntityGlob], Field(min_length=1, max_length=200)] | None = None
    services: Annotated[list[_ServiceGlob], Field(min_length=1, max_length=200)] | None = None
    actions: Annotated[list[FarmActionName], Field(min_length=1)] | None = None
    requireApproval: _RequireApproval = False
    maxOnSeconds: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] | None = None
    maxCallsPerHour: Annotated[int, Field(ge=1, le=10_000)] | None = None
    minSecondsBetween: Annotated[int | float, Field(gt=0, le=24 * 3600)] | None = None
    valueRange: Annotated[list[int | float], Field(min_length=2, max_length=2)] | None = None
    # The state the entity is safe in, when not its domain's own (off, closed, the low end of valueRange):
    # farm/control/safe_state.py. A state string ("on", "open", an option) or a number.
    safeState: Annotated[str, StringConstraints(min_length=1, max_length=255)] | int | float | None = None

    @model_validator(mode="after")
    def _coherent(self) -> Self:
        if self.entities is None and self.services is None and self.actions is None:
            raise ValueError("a rule needs entities, services or actions to say what it covers")
        limits = (self.maxOnSeconds, self.maxCallsPerHour, self.minSecondsBetween, self.valueRange, self.safeState)
        if not self.requireApproval and all(limit is None for limit in limits):
            raise ValueError(
                "a rule needs requireApproval, maxOnSeconds, maxCallsPerHour, minSecondsBetween, valueRange or safeState"
            )
        if self.maxOnSeconds is not None and self.entities is None:
            raise ValueError("maxOnSeconds needs entities: farmhost turns those entities off, whatever turned them on")
        if self.safeState is not None and self.entities is None:
            raise ValueError("safeState needs entities: it is the state those entities are put in")
        if self.valueRange is not None and self.valueRange[0] > self.valueRange[1]:
            raise ValueError("valueRange is [low, high] with low <= high")
        per_entity = (self.maxCallsPerHour, self.minSecondsBetween, self.valueRange)
        if self.entities is None and self.services is None and any(limit is not None for limit in per_entity):
            raise ValueError("maxCallsPerHour, minSecondsBetween and valueRange count per entity: give entities")
        return self


@dataclass(frozen=True, kw_only=True)
class ControlCall:
    """What a control action will do, as the rules see it (known before anything is sent to Home Assistant)."""

    action: str
    service: str | None = None  # `domain.service`, None for actions that call no single service
    entities: tuple[str, ...] = ()
    indirect: bool = False  # also targets devices/areas/floors/labels or `all`, which HA resolves on its side
    value: Any = None  # the value a set_value-like call sets (ha_set_entity's value, data.value)
    turns_on: bool = False  # a turn_on/toggle/set-to-on of `entities` (what maxOnSeconds cares about)
    # Every `domain.service` whose effect the call may have (farm/control/effects.py; a toggle: turn_on and
    # turn_off too): a rule written by service holds that effect. Empty: `service` alone.
    effect_services: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Approval:
    """The approval the matching rules ask for: who may give it (None: any member of the main chat) and how long."""

    approvers: frozenset[int] | None
    expires_minutes: float


def covers_entity(rule: ActuatorRule, entity_id: str) -> bool:
    """The rule names this entity (by an entity glob)."""
    return rule.entities is not None and _matches(entity_id, rule.entities)


def matching(rules: tuple[ActuatorRule, ...], call: ControlCall) -> list[ActuatorRule]:
    """The rules that cover `call`: by its action, or by its service (or one of the same effect) and/or entity."""
    return [rule for rule in rules if _covers(rule, call)]


def _covers(rule: ActuatorRule, call: ControlCall) -> bool:
    if rule.actions is not None and call.action in rule.actions:
        return True
    if call.service is None or (rule.entities is None and rule.services is None):
        return False
    services = call.effect_services or (call.service,)
    if rule.services is not None and not any(_matches(service, rule.services) for service in services):
        return False
    if rule.entities is None:
        return True
    # A call that targets an area or a device may reach a listed entity: it is covered, and refused by check_targets.
    return call.indirect or any(_matches(entity, rule.entities) for entity in call.entities)


def entities_under(rule: ActuatorRule, call: ControlCall) -> list[str]:
    """The call's entities this rule limits (all of them for a rule that names no entities)."""
    if rule.entities is None:
        return list(call.entities)
    return [entity for entity in call.entities if _matches(entity, rule.entities)]


def approval_for(rules: list[ActuatorRule]) -> Approval | None:
    """The approval the matched rules require: every named approver list must allow the approver; the shortest wait."""
    asked = [rule.requireApproval for rule in rules if rule.requireApproval]
    if not asked:
        return None
    approvers: frozenset[int] | None = None
    minutes: float = DEFAULT_EXPIRES_MINUTES
    objects = [spec for spec in asked if isinstance(spec, ApprovalRule)]
    for spec in objects:
        if spec.approvers is not None:
            named = frozenset(spec.approvers)
            approvers = named if approvers is None else approvers & named
    if objects:
        minutes = min(spec.expiresMinutes for spec in objects)
    return Approval(approvers=approvers, expires_minutes=minutes)


def describe(rule: ActuatorRule) -> str:
    """The rule in words, as `farmhost doctor` shows it: what it covers, then what it asks."""
    covers = " ".join(
        f"{label} {', '.join(names)}"
        for label, names in (("entities", rule.entities), ("services", rule.services), ("actions", rule.actions))
        if names
    )
    asks: list[str] = []
    if isinstance(rule.requireApproval, ApprovalRule):
        who = (
            "main chat members"
            if rule.requireApproval.approvers is None
            else "users " + ", ".join(str(user) for user in rule.requireApproval.approvers)
        )
        asks.append(f"approval by {who} within {rule.requireApproval.expiresMinutes:g} min")
    elif rule.requireApproval:
        asks.append(f"approval by main chat members within {DEFAULT_EXPIRES_MINUTES} min")
    if rule.maxOnSeconds is not None:
        asks.append(f"off after {rule.maxOnSeconds} s on")
    if rule.maxCallsPerHour is not None:
        asks.append(f"at most {rule.maxCallsPerHour} calls an hour")
    if rule.minSecondsBetween is not None:
        asks.append(f"{rule.minSecondsBetween:g} s between calls")
    if rule.valueRange is not None:
        asks.append(f"values {rule.valueRange[0]:g}..{rule.valueRange[1]:g}")
    return f"{covers}: {', '.join(asks)}"


def check_targets(rules: list[ActuatorRule], call: ControlCall) -> None:
    """A rule that lists entities or limits them per entity must see them: no area/device targets, no untargeted call.

    Raises:
        NotAllowed: naming the rule's entities and how to target them.
    """
    for rule in rules:
        per_entity = rule.maxCallsPerHour or rule.minSecondsBetween or rule.valueRange or rule.entities
        if per_entity and call.service is not None and (call.indirect or not call.entities):
            named = ", ".join(rule.entities or rule.services or ())
            raise NotAllowed(
                f"the farm profile has rules for {named}: call {call.service} with target.entity_id "
                '(not by device, area, floor or label, not "all", not through a group farmhost cannot read, and not '
                "without a target)"
            )


def check_value_range(rules: list[ActuatorRule], call: ControlCall) -> None:
    """Each entity under a `valueRange` is only set to a number inside it, by a call that says which number.

    Raises:
        NotAllowed: the value is outside the range, or the call changes the entity some other way.
    """
    for rule in rules:
        if rule.valueRange is None:
            continue
        low, high = rule.valueRange
        for entity in entities_under(rule, call):
            number = as_number(call.value)
            if number is None:
                raise NotAllowed(
                    f"the farm profile keeps {entity} between {low:g} and {high:g}: set it with ha_set_entity "
                    f"(or a set_value call with a value), not {call.service or call.action}"
                )
            if not low <= number <= high:
                raise NotAllowed(
                    f"the farm profile keeps {entity} between {low:g} and {high:g}; {number:g} is outside that range"
                )


def as_number(value: Any) -> float | None:
    """A value asked for as a number (an int, float or numeric string; never a boolean), else None.

    An integer or a text past the largest float is infinite: outside every range, never a safe state.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # a JSON integer past any float: as far outside any range as it gets
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _matches(value: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)
