"""WhenWatcher: turns farm events into due times of `when` tasks (the edge of a condition, once, past the cooldown).

It follows the live view of Home Assistant (every state change, at once) and the alerts the farm-state collector
raises. When a task's condition becomes true (and, with `for`, has held that long), one transaction records the
edge in `when_state` and sets the task's next_run to the event's time; the SchedulerService then claims that due
time like any other (claims.claim_due: once, never twice, within the grace). So fire-once across restarts is the
scheduler's: an edge recorded before a crash is claimed at start; an edge claimed before it is never repeated.

Decisions (docs/scheduler.md):
- The event's time (the due time, plus `for`) is when farmhost saw the change live; a change found at a start or
  a reconnect is dated by Home Assistant's `last_changed`, so a crossing older than the grace is `skipped`. The
  edge and the due time are one transaction: a restart finds the edge either claimable or already fired.
- A condition already true when the task is created does not fire: it waits for the next time it becomes true.
- `unavailable`/`unknown` decide nothing (the condition keeps its truth): a sensor blip is not a new crossing.
- An edge within the cooldown of the last fire, or while the task is paused, is consumed: recorded `skipped` in
  task_runs (cooldown) or dropped (paused), never deferred.
- An edge while an earlier one still waits to run (its previous run is still running) takes its place: one event
  waits per task, the latest, and it counts the ones it replaced (`folded`, in the run's prompt); the replaced
  one is recorded `skipped`. When the running run ends, `claims.record_end` makes the waiting event due then.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, tzinfo
from typing import Any, Final

from farmhost.farm.homeassistant.live_view import EntityView, LiveView, StateChange
from farmhost.farm.state.alerts import Alert, local_iso
from farmhost.scheduler.specs import ScheduleType
from farmhost.scheduler.when import Condition, ConditionError, load_condition
from farmhost.store import task_runs, tasks, when_state
from farmhost.store.db import Database, iso, now_utc
from farmhost.store.when_state import WhenState

logger = logging.getLogger(__name__)

# The `for` timer re-checks this much after the hold ends: HA's clock and ours agree to the millisecond here, and
# firing a hair late is harmless while firing before the hold ended would need a second timer.
_HOLD_SLACK: Final = 0.01
_COOLDOWN: Final = "cooldown:"  # how a skipped row of the cooldown begins


@dataclass(frozen=True, kw_only=True)
class _Watched:
    """A when task the watcher follows (active or paused)."""

    task_id: str
    group_folder: str
    status: str
    condition: Condition
    created_at: datetime


class WhenWatcher:
    """Evaluates every when task's condition on each state change and alert, and records their edges."""

    def __init__(
        self,
        *,
        db: Database,
        zone: tzinfo,
        view: LiveView | None,
        wake: Callable[[], None],
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        """Build the watcher; call `start()` before the live view starts, so its first sync is seen.

        Args:
            db: The daemon's database (used on the event loop's thread only).
            zone: The farm's timezone (the event's time in the prompt).
            view: The live view of HA (None without HA: only alert conditions can fire).
            wake: Called after an edge set a task's next_run (the scheduler's sync, which fires it at once).
            clock: The current time (aware).
        """
        self._db = db
        self._zone = zone
        self._view = view
        self._wake = wake
        self._clock = clock
        self._by_entity: dict[str, list[_Watched]] = {}
        self._by_alert: dict[str, list[_Watched]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.edges = 0  # edges recorded (the benchmark and tests read it)

    def start(self) -> None:
        """Load the when tasks and follow the live view."""
        self.refresh()
        if self._view is not None:
            self._view.add_listener(self._changed)

    def stop(self) -> None:
        """Cancel the `for` timers (their state is persisted: a restart re-arms them from the next sync)."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def refresh(self) -> None:
        """Re-read the when tasks (after any task change); a new task is evaluated against the current state."""
        by_entity: dict[str, list[_Watched]] = {}
        by_alert: dict[str, list[_Watched]] = {}
        fresh: list[_Watched] = []
        known = {w.task_id for group in self._by_entity.values() for w in group}
        for task in tasks.list_tasks(self._db.conn):
            if task.schedule_type != ScheduleType.WHEN or task.status not in ("active", "paused"):
                continue
            try:
                condition = load_condition(task.schedule_value)
            except ConditionError as err:
                logger.error("task %s: its when condition cannot be read (%s); it never fires", task.id, err)
                continue
            watched = _Watched(
                task_id=task.id,
                group_folder=task.group_folder,
                status=task.status,
                condition=condition,
                created_at=task.created_at,
            )
            if condition.alert is not None:
                by_alert.setdefault(condition.alert, []).append(watched)
            elif condition.entity is not None:
                by_entity.setdefault(condition.entity, []).append(watched)
                if task.id not in known:
                    fresh.append(watched)
        self._by_entity, self._by_alert = by_entity, by_alert
        alive = {w.task_id for group in by_entity.values() for w in group}
        for task_id in [t for t in self._timers if t not in alive]:
            self._timers.pop(task_id).cancel()
        if self._view is not None and self._view.connected:
            for watched in fresh:
                entity = self._view.get(watched.condition.entity or "")
                if entity is not None:
                    self._evaluate(watched, old=None, new=entity, seen_at=None)

    # ---- events

    def _changed(self, change: StateChange) -> None:
        watching = self._by_entity.get(change.entity_id)
        if not watching:
            return
        seen_at = None if change.resync else change.seen_at
        # One transaction (one fsync) per state change, however many tasks follow the entity: a group's 100 tasks on
        # a flapping sensor would otherwise cost 100 fsyncs per flip on the event loop every group shares.
        try:
            with self._db.tx() as conn:
                for watched in watching:
                    self._evaluate_isolated(conn, watched, old=change.old, new=change.new, seen_at=seen_at)
        except Exception:
            logger.exception("evaluating the when conditions on %s failed", change.entity_id)
        if seen_at is not None:
            logger.debug(
                "when: %s evaluated %.1f ms after the event", change.entity_id, (time.monotonic() - seen_at) * 1e3
            )

    def _evaluate_isolated(
        self,
        conn: sqlite3.Connection,
        watched: _Watched,
        *,
        old: EntityView | None,
        new: EntityView,
        seen_at: float | None,
    ) -> None:
        """Evaluate one task inside the shared transaction; a failure undoes only its own writes."""
        conn.execute("SAVEPOINT when_task")
        try:
            self._evaluate_in(conn, watched, old=old, new=new, seen_at=seen_at)
        except Exception:
            conn.execute("ROLLBACK TO when_task")
            logger.exception("task %s: evaluating its when condition failed", watched.task_id)
        conn.execute("RELEASE when_task")

    def alert_raised(self, alert: Alert) -> None:
        """The farm-state collector raised a new alert: fire the tasks waiting for its rule."""
        for watched in self._by_alert.get(alert.rule.value, ()):
            now = self._clock()
            event = {
                "alert": alert.rule.value,
                "alertId": alert.id,
                "entity": alert.entity_id,
                "severity": alert.severity.value,
                "message": alert.message,
                "since": local_iso(alert.since, self._zone),
                "at": local_iso(now, self._zone),
            }
            try:
                with self._db.tx() as conn:
                    state = when_state.get(conn, watched.task_id) or WhenState(task_id=watched.task_id)
                    if state.event is not None and state.event.get("alertId") == alert.id:
                        continue  # this alert fired the task already (raised again after a crash)
                    self._edge(conn, watched, state, due=now, event=event, now=now)
            except Exception:
                logger.exception("task %s: recording its alert event failed", watched.task_id)

    # ---- the edge

    def _evaluate(self, watched: _Watched, *, old: EntityView | None, new: EntityView, seen_at: float | None) -> None:
        if watched.condition.holds(new.state) is None:
            return
        with self._db.tx() as conn:
            self._evaluate_in(conn, watched, old=old, new=new, seen_at=seen_at)

    def _evaluate_in(
        self,
        conn: sqlite3.Connection,
        watched: _Watched,
        *,
        old: EntityView | None,
        new: EntityView,
        seen_at: float | None,
    ) -> None:
        condition = watched.condition
        truth = condition.holds(new.state)
        if truth is None:
            return
        now = self._clock()
        state = when_state.get(conn, watched.task_id)
        before = condition.holds(old.state) if old is not None else None
        if state is None and before is not None:
            # First look at a new task, on a change (the view was away when it was created): the state before
            # the change is its starting point, so this change can be its first edge.
            state = WhenState(task_id=watched.task_id, fired=before)
        elif state is None and truth and new.last_changed is not None and new.last_changed > watched.created_at:
            # First look, with nothing seen before (the view reconnected after the task was created): HA says the
            # entity changed after the task existed, so it became true under the task's watch: an edge.
            state = WhenState(task_id=watched.task_id, fired=False)
        if state is None:  # first look at a new task: true now is not an edge, it waits for the next one
            since = (new.last_changed or now) if truth else None
            when_state.put(conn, WhenState(task_id=watched.task_id, true_since=since, fired=truth), at=now)
            return
        if not truth:
            self._cancel_timer(watched.task_id)
            if state.true_since is not None or state.fired:
                when_state.put(conn, replace(state, true_since=None, fired=False), at=now)
            return
        if state.fired:
            return
        if state.true_since is None:
            # Seen live: now (within milliseconds of HA's change, and immune to a skew between the two
            # clocks). Found at a (re)sync: HA's last_changed says when it happened while nobody looked.
            since = now if seen_at is not None and old is not None else min(new.last_changed or now, now)
            state = replace(state, true_since=since)
            when_state.put(conn, state, at=now)
        assert state.true_since is not None
        due = state.true_since + timedelta(seconds=condition.hold)
        if due > now:
            self._arm(watched, due)
            return
        event = {
            "entity": new.entity_id,
            "name": new.name,
            "old": old.state if old is not None else None,
            "new": new.state,
            "at": local_iso(state.true_since, self._zone),
            "held": condition.hold or None,
        }
        self._edge(conn, watched, state, due=due, event=event, now=now)

    def _edge(
        self,
        conn: sqlite3.Connection,
        watched: _Watched,
        state: WhenState,
        *,
        due: datetime,
        event: dict[str, Any],
        now: datetime,
    ) -> None:
        """The condition became true: ask the scheduler for a run at `due`, unless paused or in the cooldown."""
        task = tasks.get_task(conn, watched.task_id)
        consumed = replace(state, fired=True)
        if task is None or task.status != "active":
            when_state.put(conn, consumed, at=now)
            logger.info("task %s: %s, but the task is %s; not run", watched.task_id, _what(watched), _status(task))
            return
        cooldown = timedelta(seconds=watched.condition.cooldown)
        if state.last_fired is not None and due - state.last_fired < cooldown:
            note = (
                f"{_COOLDOWN} {_what(watched)} again {_age(due - state.last_fired)} after the last run (cooldown "
                f"{watched.condition.cooldown:g} s); not run"
            )
            # One row per cooldown, not per crossing: a sensor flapping at its threshold would otherwise add a row
            # (and a log line) per flip for as long as it flaps. Two alerts of the rule at once (one per entity)
            # share a due time: the first one's claim owns it.
            first = not task_runs.has_skipped_after(conn, task.id, state.last_fired, reason=_COOLDOWN)
            if first and iso(due) != iso(state.last_fired) and not task_runs.has_run(conn, task.id, due):
                note += "; later crossings within this cooldown are not recorded one by one"
                task_runs.insert_run(conn, task_id=task.id, due_at=due, at=now, status="skipped", detail=note)
                logger.info("task %s: %s", task.id, note, extra={"taskId": task.id})
            else:
                logger.debug("task %s: %s", task.id, note, extra={"taskId": task.id})
            when_state.put(conn, consumed, at=now)
            return
        if (
            task.next_run is not None
        ):  # an earlier event still waits (its previous run is running): this one replaces it
            event = self._fold(conn, task.id, state, superseded=task.next_run, due=due, event=event, now=now)
        when_state.put(conn, replace(consumed, last_fired=due, event_due=due, event=event), at=now)
        tasks.set_next_run_if_active(conn, task.id, due)
        self.edges += 1
        logger.info(
            "task %s (group %s): %s; run due %s",
            task.id,
            task.group_folder,
            _what(watched),
            iso(due),
            extra={"taskId": task.id, "group": task.group_folder, "event": "when_edge"},
        )
        asyncio.get_running_loop().call_soon(self._wake_safely)

    def _fold(
        self,
        conn: sqlite3.Connection,
        task_id: str,
        state: WhenState,
        *,
        superseded: datetime,
        due: datetime,
        event: dict[str, Any],
        now: datetime,
    ) -> dict[str, Any]:
        """One event waits per task: the latest, counting the ones it replaced (its run's prompt says how many)."""
        before = state.event if state.event_due is not None and iso(state.event_due) == iso(superseded) else None
        folded = 1 + int((before or {}).get("folded") or 0)
        note = f"folded into the event due {iso(due)}: a later event came before this one could run; not run"
        if not task_runs.has_run(conn, task_id, superseded):
            task_runs.insert_run(conn, task_id=task_id, due_at=superseded, at=now, status="skipped", detail=note)
        logger.info("task %s: the event due %s is %s", task_id, iso(superseded), note, extra={"taskId": task_id})
        return {**event, "folded": folded}

    def _wake_safely(self) -> None:
        try:
            self._wake()
        except Exception:
            logger.exception("waking the scheduler after a when event failed")

    # ---- `for` timers

    def _arm(self, watched: _Watched, due: datetime) -> None:
        self._cancel_timer(watched.task_id)
        delay = max(0.0, (due - self._clock()).total_seconds()) + _HOLD_SLACK
        loop = asyncio.get_running_loop()
        self._timers[watched.task_id] = loop.call_later(delay, self._held, watched.task_id)

    def _cancel_timer(self, task_id: str) -> None:
        handle = self._timers.pop(task_id, None)
        if handle is not None:
            handle.cancel()

    def _held(self, task_id: str) -> None:
        self._timers.pop(task_id, None)
        if self._view is None:
            return
        for group in self._by_entity.values():
            for watched in group:
                if watched.task_id == task_id and watched.condition.entity is not None:
                    entity = self._view.get(watched.condition.entity)
                    if entity is not None:
                        try:
                            self._evaluate(watched, old=None, new=entity, seen_at=None)
                        except Exception:
                            logger.exception("task %s: evaluating its held condition failed", task_id)
                    return


def _what(watched: _Watched) -> str:
    return f"condition {watched.condition.describe()} became true"


def _status(task: object) -> str:
    return "gone" if task is None else str(getattr(task, "status", "?"))


def _age(delta: timedelta) -> str:
    return f"{delta.total_seconds():.0f} s"


def event_prompt(event: dict[str, Any], condition: str) -> str:
    """The lines a when task's run gets before its prompt: what happened, in the farm's time."""
    if "alert" in event:
        return (
            f"[farm event] A new {event['alert']} alert ({event.get('severity')}) on {event.get('entity')}: "
            f"{event.get('message')} (since {event.get('since')}, raised {event.get('at')}, farm time). "
            f"This task runs when: {condition}.{_folded(event)}"
        )
    old = event.get("old")
    before = f"from {old!r} " if old is not None else ""
    held = f", and held for {event['held']:g} s" if event.get("held") else ""
    return (
        f"[farm event] {event.get('name') or event.get('entity')} changed {before}to {event.get('new')!r} at "
        f"{event.get('at')} (farm time){held}. This task runs when: {condition}.{_folded(event)}"
    )


def _folded(event: dict[str, Any]) -> str:
    count = int(event.get("folded") or 0)
    if not count:
        return ""
    return (
        f" {count} earlier event{'s' if count > 1 else ''} of this task came while its previous run was still "
        "running; folded into this one."
    )
