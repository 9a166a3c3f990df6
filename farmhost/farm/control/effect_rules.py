"""Rules on effects: an agents' change of a guarded entity that a rule would have held is undone and reported.

The gate (farm/control/actuator_gate.py) checks a call's shape before it runs; this checks what actually happened, whatever the
route (a scene, a script, Assist, the helper behind a template switch). It follows the live view: for each
change the view attributes to the agents (farmhost's HA user, or caused by it) of an entity a rule covers (one
naming it, or one written by a service whose effect the change is: farm/control/effects.py), the
change is held when it needs an approval none was given for (an approved run registers a short permit for its
entity and target before it calls HA), when it breaks the rate (counted here, on effects: a call HA refused
counts nothing) or when it leaves the range. A held change is undone at once (the entity set back: off,
closed, the previous number or option) and reported: an audit line `violation`, a message to the main chat and
a `violation` alert. The message is told by farm/state/alert_notifier.py (`tell_event`, in the transaction of the
report, once per undone change) as a critical alert with Acknowledge, Snooze 1 h and Stop everything; the
notifier never tells the `violation` alert of alerts.json again. A change to the entity's safe state is never
held, never counted; while agent runs are paused (/stop, the MQTT switch) every other agents' change of a guarded
entity is held, whatever its rule asks (a call sent just before the stop lands after it). People's changes are
never undone (the automatic off still applies to them, farm/control/auto_off.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from farmhost.farm.audit import AuditLog
from farmhost.farm.control.effects import rules_of_change
from farmhost.farm.control.profile_rules import ProfileRules
from farmhost.farm.control.rules import ActuatorRule
from farmhost.farm.control.safe_state import (
    NUMBER_DOMAINS,
    SELECT_DOMAINS,
    UNKNOWN_STATES,
    domain_of,
    is_on,
    is_safe_state,
    safe_target,
)
from farmhost.farm.homeassistant.client import HAClient
from farmhost.farm.homeassistant.errors import HaError
from farmhost.farm.homeassistant.live_view import EntityView, LiveView, StateChange
from farmhost.farm.state.alert_notifier import AlertNotifier
from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.stop_messages import stop_keyboard
from farmhost.protocol.codes import ErrorCode
from farmhost.store import actuator_calls, groups, host_state
from farmhost.store.db import Database, now_utc

logger = logging.getLogger(__name__)

AUDIT_GROUP: Final = "farmhost"
AUDIT_ACTION: Final = "violation"
# Who an effect is counted for in actuator_calls (the effect does not say which group asked for it).
EFFECT_FOLDER: Final = "agents"
HOUR: Final = timedelta(hours=1)
# An approved call's permit: the call reaches HA within its 10 s timeout and the effect follows at once; 30 s
# leaves room for a slow device without leaving a window an agent could use for long.
PERMIT_SECONDS: Final = 30.0
# farmhost's own undo is expected back from HA this long (then it is an ordinary change again).
UNDO_SECONDS: Final = 15.0
# An undo that fails (a pooled connection the network dropped, HA still starting) is tried again after these
# pauses: an unapproved effect must not stand because of one transport error; about 5 s in all.
UNDO_RETRY_PAUSES: Final = (0.1, 0.5, 1.0, 3.0)
# Undo latencies kept for the benchmark and doctor (the last few hundred are plenty for a p99).
LATENCIES_KEPT: Final = 512
ON: Final = "__on__"  # a permit's target: any on-state of the entity's domain


@dataclass(frozen=True, kw_only=True)
class Undo:
    """How a held change is set back: the service call and the state it leads to."""

    domain: str
    service: str
    data: dict[str, Any]
    state: str | float


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One held change: what changed, who caused it, the rule and what farmhost did about it."""

    change: StateChange
    reason: str  # a sentence: why the rule holds it
    rule: str  # which part of the rule: requireApproval, maxCallsPerHour, minSecondsBetween, valueRange
    undo: Undo | None


class EffectRules:
    """The enforcer; one per daemon with Home Assistant configured."""

    def __init__(
        self,
        *,
        ha: HAClient,
        view: LiveView,
        db: Database,
        profile_path: Path,
        audit: AuditLog,
        started_at: datetime,
        wake_outbox: Callable[[], None] = lambda: None,
        on_violation: Callable[[str, str, datetime], Awaitable[None]] | None = None,
        alerts: AlertNotifier | None = None,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._ha = ha
        self._view = view
        self._db = db
        self._rules = ProfileRules(profile_path, who="rules on effects")
        self._audit = audit
        self._started_at = started_at
        self._wake = wake_outbox
        self._on_violation = on_violation
        self._alerts = alerts  # tells the chats (None: a plain notice to the main chat)
        self._clock = clock
        self._permits: dict[str, list[tuple[str | float | None, float]]] = {}
        self._undoing: dict[str, tuple[str | float, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.latencies: deque[float] = deque(maxlen=LATENCIES_KEPT)  # seconds from the event to HA's answer

    def start(self) -> None:
        """Follow the live view."""
        self._view.add_listener(self._changed)

    async def stop(self) -> None:
        """Let undos in flight finish (each is bounded by the HA client's timeout)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def permit(self, entity_ids: Iterable[str], target: str | float | None) -> None:
        """An approved call is about to run: its effect on these entities (to `target`, None: any) is not held.

        Args:
            entity_ids: the entities the approved call names.
            target: the state it asks for: a state string, a number, ON (any on-state) or None (any).
        """
        until = time.monotonic() + PERMIT_SECONDS
        for entity_id in entity_ids:
            self._permits.setdefault(entity_id, []).append((target, until))

    # ---- judging a change

    def _changed(self, change: StateChange) -> None:
        if not change.agents:
            return  # people's changes are theirs
        new = change.new
        if change.old is None:
            # First sight at start: only a change made since this farmhost started (an agent's call before the
            # view's first sync) is judged; an older one (an approved run before a restart) is not.
            if new.last_changed is None or new.last_changed < self._started_at:
                return
        elif change.old.known_state == new.state:
            return  # a blip (a reload, a restart) that ends where it began is no change
        if new.state in UNKNOWN_STATES:
            return
        mine = rules_of_change(self._rules.current(), change.entity_id, new.state)
        if not mine or is_safe_state(change.entity_id, new.state, mine, new.attributes):
            return
        if self._is_undo(change.entity_id, new.state):
            return
        held = self._held(change, mine)
        if held is None:
            return
        reason, rule = held
        violation = Violation(change=change, reason=reason, rule=rule, undo=_undo_of(change, mine))
        task = asyncio.get_running_loop().create_task(self._set_back(violation), name="effect-undo")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _held(self, change: StateChange, mine: list[ActuatorRule]) -> tuple[str, str] | None:
        """(why, which part of a rule) when a rule holds this change; counts it against the rates when none does."""
        entity_id, state = change.entity_id, change.new.state
        paused = host_state.get(self._db.conn, host_state.AGENTS_PAUSED)
        if paused is not None:
            # A call sent just before the stop, or an HA script an agent started, lands after it: the stop holds
            # every guarded entity, whatever its rule asks, and no approval granted before it counts.
            return f"agents are paused ({paused}): until /resume only the safe state is allowed", "paused"
        for rule in mine:
            if rule.valueRange is not None:
                number = _number(state)
                low, high = rule.valueRange
                if number is not None and not low <= number <= high:
                    return f"it was set to {state}, outside the farm profile's range {low:g}..{high:g}", "valueRange"
        if any(rule.requireApproval for rule in mine) and not self._take_permit(entity_id, state):
            return "it needs an approval in the main chat (farm profile rules) and none was given for it", (
                "requireApproval"
            )
        rated = [rule for rule in mine if rule.maxCallsPerHour is not None or rule.minSecondsBetween is not None]
        if not rated:
            return None
        now = self._clock()
        with self._db.tx() as conn:
            problem = _rate_problem(conn, entity_id, rated, now)
            if problem is None:
                actuator_calls.record(conn, [entity_id], folder=EFFECT_FOLDER, at=now)
        return problem

    def _take_permit(self, entity_id: str, state: str) -> bool:
        now = time.monotonic()
        permits = [(target, until) for target, until in self._permits.get(entity_id, []) if until > now]
        for index, (target, _until) in enumerate(permits):
            if _reaches(entity_id, state, target):
                del permits[index]  # one approval, one effect
                self._permits[entity_id] = permits
                return True
        self._permits[entity_id] = permits
        return False

    def _is_undo(self, entity_id: str, state: str) -> bool:
        expected = self._undoing.get(entity_id)
        if expected is None or expected[1] < time.monotonic():
            return False
        return _reaches(entity_id, state, expected[0])

    # ---- undoing and telling

    async def _set_back(self, violation: Violation) -> None:
        change, undo = violation.change, violation.undo
        failure: str | None = None
        latency: float | None = None
        if undo is None:
            failure = "farmhost knows no state to set it back to (name one with safeState in the rule)"
        else:
            for attempt, pause in enumerate((*UNDO_RETRY_PAUSES, None)):
                self._undoing[change.entity_id] = (undo.state, time.monotonic() + UNDO_SECONDS)
                try:
                    await self._ha.call_service(undo.domain, undo.service, {"entity_id": change.entity_id, **undo.data})
                except HaError as err:
                    failure = f"setting it back failed after {attempt + 1} tries: {err}"
                    if pause is None:
                        break
                    await asyncio.sleep(pause)  # a connection HA (or the network) just dropped: the next one works
                else:
                    failure = None
                    latency = time.monotonic() - change.seen_at
                    self.latencies.append(latency)
                    break
        await self._report(violation, latency=latency, failure=failure)

    async def _report(self, violation: Violation, *, latency: float | None, failure: str | None) -> None:
        change, undo = violation.change, violation.undo
        now = self._clock()
        name = change.new.name
        old = (change.old.known_state or change.old.state) if change.old is not None else "unknown"
        if failure is None and undo is not None:
            done = f"farmhost set it back to {_shown(undo.state)} within {_took(latency or 0.0)}."
        else:
            done = f"{failure}: check it now."
        text = (
            f"farmhost undid a change of {name} from {old} to {change.new.state}, made through the agents' Home "
            f"Assistant user: {violation.reason}. {done}"
        )
        key = f"violation:{change.entity_id}:{change.context.id or change.new.last_updated}"
        with self._db.tx() as conn:
            main = groups.main_group(conn)
            if self._alerts is not None:
                self._alerts.tell_event(conn, key=key, entity_id=change.entity_id, text=text, at=now)
            elif main is not None:
                with contextlib.suppress(sqlite3.IntegrityError):  # told already
                    enqueue_notice(conn, key=key, jid=main.jid, text=text, at=now, reply_markup=stop_keyboard())
        self._wake()
        self._audit.record(
            at=now,
            group=AUDIT_GROUP,
            request_id=key,
            action=AUDIT_ACTION,
            params={"entity_id": change.entity_id, "from": old, "to": change.new.state, "rule": violation.rule},
            error_code=ErrorCode.UPSTREAM_UNAVAILABLE if failure else None,
            duration_ms=round((latency or 0) * 1000),
            extra={
                "context": change.context.to_json(),
                "reason": violation.reason,
                "undo": f"{undo.domain}.{undo.service}" if undo else None,
                "undoneTo": undo.state if undo and not failure else None,
                "resync": change.resync,
            },
        )
        if self._on_violation is not None:
            await self._on_violation(change.entity_id, text, now)
        logger.warning("rules on effects: %s", text)


def _rate_problem(
    conn: sqlite3.Connection, entity_id: str, rated: list[ActuatorRule], now: datetime
) -> tuple[str, str] | None:
    count, latest = actuator_calls.since(conn, entity_id, now - HOUR)
    for rule in rated:
        if rule.maxCallsPerHour is not None and count >= rule.maxCallsPerHour:
            told = (
                f"it was changed {count} times in the last hour already; the farm profile allows {rule.maxCallsPerHour}"
            )
            return told, "maxCallsPerHour"
        if rule.minSecondsBetween is not None and latest is not None:
            ago = (now - latest).total_seconds()
            if ago < rule.minSecondsBetween:
                told = f"it was changed {ago:.0f} s before; the farm profile allows one change every {rule.minSecondsBetween:g} s"
                return told, "minSecondsBetween"
    return None


def _undo_of(change: StateChange, mine: list[ActuatorRule]) -> Undo | None:
    """The previous state for numbers and options (when the rules allow it), else the entity's safe state."""
    entity_id, old = change.entity_id, change.old
    domain = domain_of(entity_id)
    before = old.known_state if old is not None else None
    if before is not None and domain in NUMBER_DOMAINS:
        value = _number(before)
        if value is not None and _in_ranges(value, mine):
            return Undo(domain=domain, service="set_value", data={"value": value}, state=value)
    if before is not None and domain in SELECT_DOMAINS:
        return Undo(domain=domain, service="select_option", data={"option": before}, state=before)
    target = safe_target(entity_id, mine, _attributes(old))
    if target is None:
        return None
    return Undo(domain=target.domain, service=target.service, data=dict(target.data), state=target.state)


def _reaches(entity_id: str, state: str, target: str | float | None) -> bool:
    if target is None:
        return True
    if target == ON:
        return is_on(entity_id, state) is True
    if isinstance(target, float | int):
        number = _number(state)
        return number is not None and abs(number - float(target)) < 1e-9
    return state.strip().lower() == target.strip().lower() or (
        target.lower() == "on" and is_on(entity_id, state) is True
    )


def _in_ranges(value: float, mine: list[ActuatorRule]) -> bool:
    return all(rule.valueRange is None or rule.valueRange[0] <= value <= rule.valueRange[1] for rule in mine)


def _attributes(view: EntityView | None) -> Mapping[str, Any]:
    return view.attributes if view is not None else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _took(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _shown(state: str | float) -> str:
    return f"{state:g}" if isinstance(state, float) else state
