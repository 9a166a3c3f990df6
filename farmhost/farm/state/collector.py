"""The farm state collector: polls Home Assistant into `farm-state/` files, and the `farm_state_refresh` action."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final
from zoneinfo import ZoneInfo

from farmhost.background import cancel_and_wait
from farmhost.errors import Unavailable
from farmhost.farm.homeassistant.client import HaError, HaUnavailable
from farmhost.farm.state import telemetry
from farmhost.farm.state.alerts import (
    Alert,
    AlertBook,
    Rule,
    Severity,
    alert_id,
    evaluate,
    local_iso,
    reconcile,
    with_event_alert,
)
from farmhost.farm.state.files import StateStore
from farmhost.farm.state.inventory import CALENDAR, DEVICES, entities_document, fetch_calendar, fetch_devices
from farmhost.files import dump_json

if TYPE_CHECKING:
    from farmhost.config import StateSettings
    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.farm.homeassistant.live_view import EntityView, LiveView, StateChange
    from farmhost.farm.state.alert_notifier import AlertNotifier
    from farmhost.handling import RequestContext
    from farmhost.layout import DataLayout
    from farmhost.protocol.params import NoParams

logger = logging.getLogger(__name__)

CURRENT: Final = "current.json"
ALERTS: Final = "alerts.json"

# What current.json's context holds from HA (kept from the last good poll while HA is down).
_HA_CONTEXT_KEYS: Final = frozenset({"haVersion", "haTimezone", "location"})

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The real clock."""
    return datetime.now(UTC)


@dataclass(frozen=True, kw_only=True)
class RefreshSummary:
    """What one refresh did; `error` is why Home Assistant could not be read (the files then say stale)."""

    entities: int
    active_alerts: int
    ha_connected: bool
    files: tuple[str, ...]
    generated_at: str
    error: HaError | None = None

    def to_json(self) -> dict[str, Any]:
        """The `farm_state_refresh` result."""
        return {
            "entities": self.entities,
            "activeAlerts": self.active_alerts,
            "haConnected": self.ha_connected,
            "files": list(self.files),
            "generatedAt": self.generated_at,
        }


@dataclass(kw_only=True)
class _Snapshot:
    """The last good view of HA, kept so the files stay useful (and marked stale) while HA is down."""

    entities: dict[str, dict[str, Any]] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    fresh_at: str | None = None  # farm-local ISO time of the last successful poll


class StateCollector:
    """Polls HA on a cadence and writes `current.json`, `alerts.json`, `devices.json`, `calendar.json` and telemetry.

    Every file is written atomically through a directory descriptor, every date is in the farm's time zone, and
    `alerts.json` is read back at start so alerts survive restarts.
    """

    def __init__(
        self,
        *,
        ha: HAClient,
        layout: DataLayout,
        settings: StateSettings,
        clock: Clock = utc_now,
    ) -> None:
        if min(settings.poll_seconds, settings.telemetry_seconds, settings.inventory_seconds) <= 0:
            raise ValueError("cadences must be positive")
        self.ha = ha
        self.layout = layout
        self.settings = settings
        self.zone: ZoneInfo = settings.zone
        self.poll_seconds = settings.poll_seconds
        self.telemetry_seconds = settings.telemetry_seconds
        self.inventory_seconds = settings.inventory_seconds
        self.calendar_days = settings.calendar_days
        self.resolved_keep = settings.resolved_keep
        self.thresholds = settings.thresholds
        self.clock = clock
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loaded = False
        self._book = AlertBook()
        self._snapshot = _Snapshot()
        self._store = StateStore(
            layout.farm_state, zone=self.zone, telemetry_retention_days=settings.telemetry_retention_days
        )
        self._connected: bool | None = None
        self._down_since = 0.0
        self._last_failure = ""
        self._problems: dict[str, str] = {}
        self._raised_listeners: list[Callable[[Alert], None]] = []
        self._notifier: AlertNotifier | None = None
        self._view: LiveView | None = None
        self._changed = asyncio.Event()
        self._dirty: set[str] = set()  # entities changed since the live view was last judged
        self._live_task: asyncio.Task[None] | None = None

    @classmethod
    def from_deps(cls, deps: FarmDeps) -> StateCollector:
        """A collector for the app's HA client, data directory and the farm's collector settings.

        Raises:
            Unavailable: Home Assistant is not configured.
        """
        if deps.ha is None:
            raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
        return cls(ha=deps.ha, layout=deps.layout, settings=deps.settings.state)

    @property
    def running(self) -> bool:
        """The background task is running."""
        return self._task is not None and not self._task.done()

    def add_raised_listener(self, listener: Callable[[Alert], None]) -> None:
        """Call `listener` with each alert newly raised from now on (on the loop; it must not block)."""
        self._raised_listeners.append(listener)

    def _announce_raised(self, before: AlertBook) -> None:
        known = {alert.id for alert in before.active}
        for alert in self._book.active:
            if alert.id in known:
                continue
            for listener in list(self._raised_listeners):
                try:
                    listener(alert)
                except Exception:  # one listener's bug must not stop the collector
                    logger.exception("farm state: an alert listener failed on %s", alert.id)

    def active_alerts(self) -> list[tuple[str, str, str]]:
        """The alerts active now, as (id, rule, message)."""
        return [(alert.id, alert.rule.value, alert.message) for alert in self._book.active]

    def attach(self, *, notifier: AlertNotifier | None = None, view: LiveView | None = None) -> None:
        """Tell `notifier` the active alerts after every evaluation; with `view`, evaluate within a second of a change.

        Between polls the alerts follow the live view: each change (coalesced while one evaluation runs) is judged
        against every entity as the view shows it, so a frost is raised when the thermometer crosses, not at the
        next poll. Call before `start`.
        """
        self._notifier = notifier
        if view is not None:
            self._view = view
            view.add_listener(self._on_change)

    def _on_change(self, change: StateChange) -> None:
        self._dirty.add(change.entity_id)
        self._changed.set()

    async def raise_violation(self, entity_id: str, message: str, at: datetime) -> None:
        """Raise a `violation` alert now (alerts.json at once; MQTT announces it at its next look)."""
        async with self._lock:
            await self._ensure_loaded()
            alert = Alert(
                id=alert_id(Rule.VIOLATION, entity_id, at),
                rule=Rule.VIOLATION,
                entity_id=entity_id,
                severity=Severity.CRITICAL,
                message=message,
                since=at,
            )
            before, self._book = self._book, with_event_alert(self._book, alert)
            files = [(ALERTS, dump_json(self._book.to_json(self.zone)))]
            await asyncio.to_thread(self._store.write_sync, files, rewrite=False, sample=None)
            if self._notifier is not None:
                self._notifier.observe(self._book.active, at)
        self._announce_raised(before)

    async def start(self) -> None:
        """Read the previous alerts and snapshot, then poll in the background (the first poll runs at once)."""
        if self.running:
            return
        async with self._lock:
            await self._ensure_loaded()
        self._task = asyncio.create_task(self._run(), name="farm-state-collector")
        if self._view is not None:
            self._live_task = asyncio.create_task(self._follow(), name="farm-state-live")

    async def stop(self) -> None:
        """Cancel the background task and wait for it (a write in progress finishes: it runs in a thread)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        live, self._live_task = self._live_task, None
        await cancel_and_wait(live)

    async def refresh_now(self, *, telemetry: bool = False) -> RefreshSummary:
        """Poll HA now and rewrite every file (devices and calendar included); optionally take a telemetry sample."""
        return await self._refresh(inventory=True, sample=telemetry, rewrite=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_poll = next_sample = next_inventory = loop.time()
        while True:
            now = loop.time()
            inventory, sample = now >= next_inventory, now >= next_sample
            try:
                await self._refresh(inventory=inventory, sample=sample, rewrite=False)
            except Exception as err:  # noqa: BLE001 - a bug or full disk must not end the loop; logged once per failure
                self._log_failure(err)
            else:
                self._last_failure = ""
            now = loop.time()
            next_poll = _advance(next_poll, self.poll_seconds, now)
            if sample:
                next_sample = _advance(next_sample, self.telemetry_seconds, now)
            if inventory:
                next_inventory = _advance(next_inventory, self.inventory_seconds, now)
            await asyncio.sleep(max(0.0, min(next_poll, next_sample, next_inventory) - loop.time()))

    async def _follow(self) -> None:
        """Judge the alerts again on each change the live view shows (alerts.json is written when they change)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._evaluate_live()
            except Exception as err:  # noqa: BLE001 - a bug or full disk must not end the loop; logged once per failure
                self._log_failure(err)

    async def _evaluate_live(self) -> None:
        view = self._view
        if view is None or not view.connected:
            return  # the poll judges (the view's states are incomplete before its first sync)
        async with self._lock:
            await self._ensure_loaded()
            entities = view.entities()
            dirty, self._dirty = self._dirty, set()
            now = self.clock()
            changed = [_raw_state(entities[e]) for e in dirty if e in entities]
            raised = {alert.key for alert in evaluate(changed, self.thresholds, now)}
            known = {a.key for a in self._book.active if a.entity_id in dirty and a.rule is not Rule.VIOLATION}
            if raised == known and len(changed) == len(dirty):
                return  # no alert comes or goes (a value within an alert is brought up to date by the next poll)
            states = [_raw_state(entity) for entity in entities.values()]
            book = reconcile(
                self._book, evaluate(states, self.thresholds, now), states, now, keep_resolved=self.resolved_keep
            )
            before = self._book
            if book.active != self._book.active or book.resolved != self._book.resolved:
                self._book = book
                files = [(ALERTS, dump_json(book.to_json(self.zone)))]
                await asyncio.to_thread(self._store.write_sync, files, rewrite=False, sample=None)
            if self._notifier is not None:
                self._notifier.observe(self._book.active, now)
        self._announce_raised(before)

    async def _refresh(self, *, inventory: bool, sample: bool, rewrite: bool) -> RefreshSummary:
        async with self._lock:
            await self._ensure_loaded()
            error: HaError | None = None
            try:
                config, states = await self._poll()
            except HaError as err:
                error = err
                config, states = {}, []
            now = self.clock()
            files: list[tuple[str, bytes]] = []
            if error is None:
                self._on_connected()
                before = self._book
                self._book = reconcile(
                    self._book, evaluate(states, self.thresholds, now), states, now, keep_resolved=self.resolved_keep
                )
                if self._notifier is not None:
                    self._notifier.observe(self._book.active, now)
                self._snapshot = _Snapshot(
                    entities=entities_document(states, self.zone),
                    context=self._context(config),
                    fresh_at=local_iso(now, self.zone),
                )
                if inventory:
                    files.extend(await self._inventory(states, now))
            else:
                self._on_disconnected(error)
            files.append((CURRENT, dump_json(self._current(now, error))))
            files.append((ALERTS, dump_json(self._book.to_json(self.zone))))
            line = None
            if sample and error is None:
                line = (now, telemetry.sample_line(now, telemetry.numeric_values(states), self.zone))
            written = await asyncio.to_thread(self._store.write_sync, files, rewrite=rewrite, sample=line)
            if error is None:
                self._announce_raised(before)
            return RefreshSummary(
                entities=len(self._snapshot.entities),
                active_alerts=len(self._book.active),
                ha_connected=error is None,
                files=tuple(written),
                generated_at=local_iso(now, self.zone),
                error=error,
            )

    async def _inventory(self, states: list[dict[str, Any]], now: datetime) -> list[tuple[str, bytes]]:
        """devices.json and calendar.json (a part HA cannot give now keeps its last file)."""
        files: list[tuple[str, bytes]] = []
        devices = await fetch_devices(self.ha, states, now=now, zone=self.zone)
        calendar = await fetch_calendar(self.ha, states, now=now, zone=self.zone, days=self.calendar_days)
        for name, fetched in ((DEVICES, devices), (CALENDAR, calendar)):
            self._problem(name, fetched.problem)
            if fetched.document is not None:
                files.append((name, dump_json(fetched.document)))
        return files

    async def _poll(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """HA's config and states; HA that is up but not RUNNING yet counts as down (its states are incomplete)."""
        config = await self.ha.get_config()
        if config.get("state") != "RUNNING":
            raise HaUnavailable(f"Home Assistant is not running yet (state {config.get('state')!r})")
        states = await self.ha.get_states()
        return config, [s for s in states if isinstance(s, dict) and isinstance(s.get("entity_id"), str)]

    def _context(self, config: Mapping[str, Any]) -> dict[str, Any]:
        context: dict[str, Any] = {}
        if isinstance(config.get("version"), str):
            context["haVersion"] = config["version"]
        if isinstance(config.get("time_zone"), str):
            context["haTimezone"] = config["time_zone"]
        location = {k: config.get(k) for k in ("latitude", "longitude", "elevation")}
        if isinstance(config.get("location_name"), str):
            location = {"name": config["location_name"], **location}
        if any(v is not None for v in location.values()):
            context["location"] = location
        return context

    def _current(self, now: datetime, error: HaError | None) -> dict[str, Any]:
        snapshot = self._snapshot
        doc: dict[str, Any] = {"generatedAt": local_iso(now, self.zone), "haConnected": error is None}
        if error is not None:
            doc["staleSince"] = snapshot.fresh_at
            doc["haError"] = error.message
        doc["entities"] = snapshot.entities
        doc["alerts"] = [a.to_json(self.zone) for a in self._book.active]
        doc["context"] = {
            "timezone": self.zone.key,
            "farmMode": self.settings.farm_mode,
            **snapshot.context,
            "pollSeconds": self.poll_seconds,
        }
        return doc

    async def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._book, self._snapshot = await asyncio.to_thread(self._load_sync)
            self._loaded = True

    def _load_sync(self) -> tuple[AlertBook, _Snapshot]:
        """The alerts and the last snapshot from the files of an earlier run (empty when missing or unreadable)."""
        docs = self._store.read_json_sync(ALERTS, CURRENT)
        alerts_doc, current_doc = docs[ALERTS], docs[CURRENT]
        book = AlertBook()
        if alerts_doc is not None:
            try:
                book = AlertBook.from_json(alerts_doc)
            except (TypeError, ValueError) as err:
                logger.warning("farm state: ignoring unreadable %s (%s); alerts start empty", ALERTS, err)
        snapshot = _Snapshot()
        if isinstance(current_doc, dict) and isinstance(current_doc.get("entities"), dict):
            fresh = current_doc.get("generatedAt") if current_doc.get("haConnected") else current_doc.get("staleSince")
            context = current_doc.get("context")
            context = context if isinstance(context, dict) else {}
            snapshot = _Snapshot(
                entities=current_doc["entities"],
                context={k: v for k, v in context.items() if k in _HA_CONTEXT_KEYS},
                fresh_at=fresh if isinstance(fresh, str) else None,
            )
        return book, snapshot

    def _on_connected(self) -> None:
        if self._connected is False:
            logger.info(
                "farm state: Home Assistant back after %.0f s; farm-state is fresh again",
                time.monotonic() - self._down_since,
            )
        self._connected = True

    def _on_disconnected(self, error: HaError) -> None:
        if self._connected is not False:
            self._down_since = time.monotonic()
            logger.warning(
                "farm state: Home Assistant not available (%s); farm-state/%s is marked stale until it is back",
                error.message,
                CURRENT,
            )
        self._connected = False

    def _problem(self, part: str, problem: str | None) -> None:
        """Log a part's problem when it starts (or changes) and once when it is gone, never on every poll."""
        before = self._problems.get(part)
        if problem is not None and problem != before:
            logger.info("farm state: %s", problem)
        elif problem is None and before is not None:
            logger.info("farm state: %s is complete again", part)
        if problem is None:
            self._problems.pop(part, None)
        else:
            self._problems[part] = problem

    def _log_failure(self, err: Exception) -> None:
        text = repr(err)
        if text != self._last_failure:
            logger.exception("farm state: refresh failed; the collector keeps polling")
        self._last_failure = text


async def farm_state_refresh(deps: FarmDeps, ctx: RequestContext, params: NoParams) -> dict[str, Any]:
    """Poll HA now and rewrite `farm-state/*.json`; returns {entities, activeAlerts, haConnected, files, generatedAt}.

    Raises:
        Unavailable: Home Assistant is not configured.
        HaError: HA could not be read; the files were still rewritten, marked stale (`haConnected: false`).
    """
    # The app's running collector when it is in the deps (one writer of farm-state/), else a one-off collector that
    # picks up the alerts from alerts.json.
    collector = deps.state
    if collector is None:
        collector = StateCollector.from_deps(deps)
    summary = await collector.refresh_now()
    if summary.error is not None:
        err = summary.error
        raise type(err)(f"{err.message}; farm-state was rewritten with haConnected false", code=err.code)
    return summary.to_json()


def _raw_state(entity: EntityView) -> dict[str, Any]:
    """The live view's entity as the HA state document the alert rules read."""
    doc: dict[str, Any] = {"entity_id": entity.entity_id, "state": entity.state, "attributes": entity.attributes}
    if entity.last_changed is not None:
        doc["last_changed"] = entity.last_changed.isoformat()
    return doc


def _advance(deadline: float, period: float, now: float) -> float:
    """The next deadline after `now` on the grid `deadline + k * period` (missed ticks are skipped, no drift)."""
    if deadline > now:
        return deadline
    return deadline + (int((now - deadline) // period) + 1) * period
