"""`when` conditions: validate the JSON object an agent gives as `schedule_value`, store it, test it on a state.

`schedule_value` of a `when` task is a JSON object, never a string holding JSON (SPEC §5): either
``{"entity": "<entity id>", "above"?: n, "below"?: n, "state"?: "<state>", "for"?: seconds}`` or
``{"alert": "<alert rule>"}``, each with an optional ``"cooldown": seconds`` (default 3600). Every mistake is
refused with a sentence naming the field (``schedule_value.below``). The stored form is canonical JSON, so
`current_tasks.json` and `task list` show exactly what is evaluated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from farmhost.farm.control.safe_state import UNKNOWN_STATES
from farmhost.farm.state.alerts import Rule
from farmhost.protocol.codes import ENTITY_ID_RE

# The SPEC's default: a farm event wakes the agent at most once an hour unless the task asks otherwise.
DEFAULT_COOLDOWN: Final = 3600.0
# Below this a flapping sensor would wake the agent (an LLM run) every few seconds; tests use it as the short one.
MIN_COOLDOWN: Final = 5.0
# A month: a longer silence is better expressed by pausing the task.
MAX_COOLDOWN: Final = 30 * 86400.0
# A week: a condition that must hold longer is a report, not an event (and a week of hold survives restarts).
MAX_HOLD: Final = 7 * 86400.0
_MAX_STATE_CHARS: Final = 255  # HA's own limit on a state string
_ENTITY_FIELDS: Final = ("entity", "above", "below", "state", "for")
_FIELDS: Final = (*_ENTITY_FIELDS, "alert", "cooldown")
EXAMPLE: Final = '{"entity": "sensor.field_1_soil_moisture", "below": 25, "for": 600} or {"alert": "frost"}'


class ConditionError(ValueError):
    """A `when` condition is invalid; the message names the field (``schedule_value.<field>``)."""


@dataclass(frozen=True, kw_only=True)
class Condition:
    """A validated `when` condition: an entity's state or threshold (held `hold` seconds), or an alert rule."""

    entity: str | None = None
    above: float | None = None
    below: float | None = None
    state: str | None = None
    hold: float = 0.0  # the `for` field
    alert: str | None = None
    cooldown: float = DEFAULT_COOLDOWN

    def to_json(self) -> dict[str, object]:
        """The condition as the agent wrote it (fields left at their default are omitted, cooldown is kept)."""
        doc: dict[str, object] = {}
        if self.alert is not None:
            doc["alert"] = self.alert
        else:
            doc["entity"] = self.entity
            for key, value in (("above", self.above), ("below", self.below), ("state", self.state)):
                if value is not None:
                    doc[key] = _plain(value)
            if self.hold:
                doc["for"] = _plain(self.hold)
        doc["cooldown"] = _plain(self.cooldown)
        return doc

    def canonical(self) -> str:
        """The stored `schedule_value`: compact JSON with sorted keys."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        """A short human phrase: "sensor.x below 25 for 600 s", "a new frost alert"."""
        if self.alert is not None:
            return f"a new {self.alert} alert"
        parts = []
        if self.state is not None:
            parts.append(f"is {self.state!r}")
        if self.above is not None:
            parts.append(f"above {_plain(self.above)}")
        if self.below is not None:
            parts.append(f"below {_plain(self.below)}")
        held = f" for {_plain(self.hold)} s" if self.hold else ""
        return f"{self.entity} {' and '.join(parts)}{held}"

    def holds(self, state: str) -> bool | None:
        """Whether an entity state satisfies the condition; None for unavailable/unknown (a blip decides nothing).

        A threshold on a state that is not a number is False: the value is not below 25 if it is "dry".
        """
        if state in UNKNOWN_STATES:
            return None
        if self.state is not None:
            return state == self.state
        try:
            value = float(state)
        except ValueError:
            return False
        if not math.isfinite(value):
            return False
        if self.above is not None and not value > self.above:
            return False
        return not (self.below is not None and not value < self.below)


def parse_condition(value: object) -> Condition:
    """Validate a `when` schedule_value as the agent sent it.

    Args:
        value: The decoded JSON value of `schedule_value`; it must be an object.

    Returns:
        The condition.

    Raises:
        ConditionError: With a sentence naming the offending field.
    """
    if isinstance(value, str):
        raise ConditionError(
            f"schedule_value of a when task must be a JSON object, not a string (not JSON inside a string): {EXAMPLE}"
        )
    if not isinstance(value, Mapping):
        raise ConditionError(f"schedule_value of a when task must be a JSON object such as {EXAMPLE}")
    for key in value:
        if key not in _FIELDS:
            raise ConditionError(
                f"schedule_value.{key} is not a condition field; use entity with above/below/state/for, or alert; "
                "plus cooldown"
            )
    cooldown = _seconds(value, "cooldown", DEFAULT_COOLDOWN, low=MIN_COOLDOWN, high=MAX_COOLDOWN)
    if "alert" in value:
        return _alert_condition(value, cooldown)
    return _entity_condition(value, cooldown)


def _alert_condition(value: Mapping[str, object], cooldown: float) -> Condition:
    extra = [key for key in _ENTITY_FIELDS if key in value]
    if extra:
        raise ConditionError(
            f"schedule_value.{extra[0]} cannot be combined with schedule_value.alert; an alert condition is "
            '{"alert": "<rule>"} (plus cooldown)'
        )
    rule = value["alert"]
    rules = ", ".join(r.value for r in Rule)
    if not isinstance(rule, str) or rule not in {r.value for r in Rule}:
        raise ConditionError(f"schedule_value.alert must be one of the alert rules {rules}; got {rule!r}")
    return Condition(alert=rule, cooldown=cooldown)


def _entity_condition(value: Mapping[str, object], cooldown: float) -> Condition:
    if "entity" not in value:
        raise ConditionError(f"schedule_value.entity (or schedule_value.alert) is required: {EXAMPLE}")
    entity = value["entity"]
    if not isinstance(entity, str) or not ENTITY_ID_RE.fullmatch(entity):  # anything else never matches a state
        raise ConditionError(
            f"schedule_value.entity must be a Home Assistant entity id such as 'sensor.field_1_soil_moisture'; "
            f"got {entity!r}"
        )
    above, below = _number(value, "above"), _number(value, "below")
    raw_state = value.get("state")
    state = raw_state if isinstance(raw_state, str) else None
    if "state" in value:
        if state is None or not state or len(state) > _MAX_STATE_CHARS or "\x00" in state:
            raise ConditionError(
                f"schedule_value.state must be a state string such as 'on' (1-{_MAX_STATE_CHARS} characters); "
                f"got {raw_state!r}"
            )
        if above is not None or below is not None:
            field = "above" if above is not None else "below"
            raise ConditionError(
                f"schedule_value.{field} cannot be combined with schedule_value.state; give a state or a threshold"
            )
    elif above is None and below is None:
        raise ConditionError(
            "schedule_value.below (or above, or state) is required with schedule_value.entity: what must be true "
            "of the entity"
        )
    if above is not None and below is not None and above >= below:
        raise ConditionError(
            f"schedule_value.below ({_plain(below)}) must be greater than schedule_value.above ({_plain(above)}): "
            "together they mean a value between them, which would never be true"
        )
    hold = _seconds(value, "for", 0.0, low=0.0, high=MAX_HOLD)
    return Condition(entity=entity, above=above, below=below, state=state, hold=hold, cooldown=cooldown)


def load_condition(stored: str) -> Condition:
    """Read back a stored `schedule_value` (canonical JSON, validated when it was stored).

    Raises:
        ConditionError: If the stored text is not a valid condition (a hand-edited database).
    """
    try:
        doc = json.loads(stored)
    except ValueError:
        raise ConditionError(f"stored when condition is not JSON: {stored[:80]!r}") from None
    return parse_condition(doc)


def _number(value: Mapping[str, object], key: str) -> float | None:
    if key not in value:
        return None
    raw = value[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConditionError(f"schedule_value.{key} must be a number such as 25; got {raw!r}")
    return float(raw)


def _seconds(value: Mapping[str, object], key: str, default: float, *, low: float, high: float) -> float:
    if key not in value:
        return default
    raw = value[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConditionError(f"schedule_value.{key} must be a number of seconds such as 600; got {raw!r}")
    if not low <= raw <= high:
        raise ConditionError(
            f"schedule_value.{key} must be between {_plain(low)} and {_plain(high)} seconds; got {_plain(float(raw))}"
        )
    return float(raw)


def _plain(number: float | str) -> float | int | str:
    """25.0 -> 25 (what the agent wrote), other numbers and strings as they are."""
    if isinstance(number, float) and number.is_integer():
        return int(number)
    return number
