"""Receipts: what farmhost itself saw change in Home Assistant during an agent run, told under the agent's words.

Models claim actions they never took; a receipt is farmhost's own account. The book follows the live view and
keeps the agents' changes (context of farmhost's HA user, or caused by one) with when farmhost saw them, and the
farm handlers mark each control action a group asked for with its outcome. A run's receipt is the agents'
changes within the run's time window, when the run's group asked for control in that window, plus its control
actions that failed or wait for approval. A run that changed nothing and asked for nothing carries none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from farmhost.farm.control.safe_state import UNKNOWN_STATES
from farmhost.farm.homeassistant.names import friendly_name
from farmhost.protocol.catalog import CONTROL_ACTIONS
from farmhost.protocol.codes import ErrorCode
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

    from farmhost.farm.homeassistant.live_view import LiveView, StateChange

# Changes and marks kept: far more than one run makes; a busy farm's agents change a few entities a minute.
KEPT: Final = 2048
# The most lines a receipt shows; the rest is counted ("… and 4 more"), so a scene cannot flood the chat.
MAX_LINES: Final = 10
HEADING: Final = "Seen in Home Assistant:"
# Entities whose state is the time they were last used: a scene or button said as "activated", and Assist's own
# conversation entity (and events, notify, speech) left out: they are not the farm.
USED_AT_DOMAINS: Final = frozenset({"scene", "button", "input_button"})
NOT_THE_FARM: Final = frozenset({"conversation", "event", "notify", "tts", "stt", "assist_satellite"})


@dataclass(frozen=True, kw_only=True)
class SeenChange:
    """One change the agents made, as farmhost saw it."""

    entity_id: str
    name: str
    old: str
    new: str
    at: datetime  # HA's last_changed (shown to the farmer)
    seen: datetime  # farmhost's clock when the event arrived (the run's window is on this clock)


@dataclass(frozen=True, kw_only=True)
class ActionMark:
    """One control action a group asked for, and how it ended (None: it ran)."""

    group: str
    action: str
    params: Mapping[str, Any]
    at: datetime
    code: ErrorCode | None


class ReceiptBook:
    """The agents' recent changes and control actions; one per daemon."""

    def __init__(self, *, clock: Callable[[], datetime] = now_utc) -> None:
        self._clock = clock
        self._changes: deque[SeenChange] = deque(maxlen=KEPT)
        self._marks: deque[ActionMark] = deque(maxlen=KEPT)
        self._view: LiveView | None = None

    def follow(self, view: LiveView) -> None:
        """Keep the agents' changes the live view reports from now on."""
        self._view = view
        view.add_listener(self._changed)

    def action(self, *, group: str, action: str, params: Mapping[str, Any], code: ErrorCode | None) -> None:
        """A farm action ended (the farm handlers call this); only control actions are kept."""
        if action in CONTROL_ACTIONS:
            self._marks.append(ActionMark(group=group, action=action, params=dict(params), at=self._clock(), code=code))

    def receipt(self, *, group: str, start: datetime, end: datetime, zone: ZoneInfo) -> str | None:
        """The receipt of a run of `group` between `start` and `end`, or None when it changed and asked nothing.

        Lines: `✔ Irrigation pump off → on, 06:31` per change, `⏳ ... waits for approval`, `✘ ... failed (code)`.
        """
        marks = [m for m in self._marks if m.group == group and start <= m.at <= end]
        if not marks:
            return None
        ran = any(m.code is None for m in marks)  # a run whose every call was refused changed nothing itself
        lines = [
            f"✔ {_said(c)}, {c.at.astimezone(zone):%H:%M}" for c in self._changes if ran and start <= c.seen <= end
        ]
        for mark in marks:
            if mark.code == ErrorCode.PENDING_APPROVAL:
                lines.append(f"⏳ {self._what(mark)} waits for approval")
            elif mark.code is not None:
                lines.append(f"✘ {self._what(mark)} failed ({mark.code.value})")
        if not lines:
            return None
        shown = lines[:MAX_LINES]
        if len(lines) > MAX_LINES:
            shown.append(f"… and {len(lines) - MAX_LINES} more")
        return "\n".join([HEADING, *shown])

    def _changed(self, change: StateChange) -> None:
        if not change.agents or change.old is None:
            return
        old, new = change.old.state, change.new.state
        if old == new or new in UNKNOWN_STATES or old in UNKNOWN_STATES:
            return  # an attribute update, or a blip of availability: nothing an agent did
        domain = change.entity_id.split(".", 1)[0]
        if domain in NOT_THE_FARM:
            return
        self._changes.append(
            SeenChange(
                entity_id=change.entity_id,
                name=_name(change.new.attributes, change.entity_id),
                old=old,
                new=new,
                at=change.new.last_changed or self._clock(),
                seen=self._clock(),
            )
        )

    def _what(self, mark: ActionMark) -> str:
        p = mark.params
        if mark.action == "ha_set_entity":
            return f"set {self._entity(p.get('entityId'))} to {p.get('value')}"
        if mark.action == "ha_call_service":
            target = p.get("target") if isinstance(p.get("target"), Mapping) else {}
            data = p.get("data") if isinstance(p.get("data"), Mapping) else {}
            ids = (target or {}).get("entity_id") or (data or {}).get("entity_id")
            names = ", ".join(self._entity(i) for i in ([ids] if isinstance(ids, str) else ids or []))
            return f"{p.get('domain')}.{p.get('service')}" + (f" on {names}" if names else "")
        if mark.action == "ha_assist":
            return f"Assist: “{str(p.get('text', ''))[:80]}”"
        return mark.action

    def _entity(self, entity_id: object) -> str:
        seen = self._view.get(str(entity_id)) if self._view is not None else None
        return _name(seen.attributes, str(entity_id)) if seen is not None else str(entity_id)


def _said(change: SeenChange) -> str:
    if change.entity_id.split(".", 1)[0] in USED_AT_DOMAINS:
        return f"{change.name} activated"
    return f"{change.name} {change.old} → {change.new}"


def _name(attributes: Mapping[str, Any], entity_id: str) -> str:
    return friendly_name(attributes) or entity_id
