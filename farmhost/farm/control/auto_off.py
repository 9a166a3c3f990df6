"""Automatic off: farmhost turns off what a `maxOnSeconds` rule covers once it has been on that long.

The watcher follows Home Assistant's live view (farm/homeassistant/live_view.py), so it sees an entity switched on by
anything: an agent, a scheduled task, an automation, a hand on the wall switch. The on-time counts from the
moment farmhost first saw the entity on and is reset only when farmhost sees it off: a `template.reload`, an
HA restart or an `unavailable` blip re-stamp HA's `last_changed` but never re-time the off (after farmhost was
down, the count starts from HA's `last_changed` at most). Each on-period gets a durable row
(`store/auto_off.py`) with its off time, claimed once when the time comes; after a crash or a power cut the row
is still there and the entity is turned off as soon as farmhost is back, and the main chat is told why late. An
entity seen going off before its time cancels its row. Home Assistant away or refusing: the off is tried again
at the next look. Nothing polls Home Assistant: a look reads the view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final

from farmhost.background import cancel_and_wait
from farmhost.farm.audit import AuditLog
from farmhost.farm.control import rules
from farmhost.farm.control.profile_rules import ProfileRules
from farmhost.farm.control.rules import ActuatorRule
from farmhost.farm.control.safe_state import is_on
from farmhost.farm.homeassistant.client import HAClient
from farmhost.farm.homeassistant.errors import HaError
from farmhost.farm.homeassistant.live_view import EntityView, LiveView, StateChange
from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.stop_messages import stop_keyboard
from farmhost.protocol.codes import ErrorCode
from farmhost.store import auto_off, groups
from farmhost.store.auto_off import AutoOffRow
from farmhost.store.db import Database, now_utc

logger = logging.getLogger(__name__)

# The longest wait between looks when no off is due sooner: a profile edit (a new or tighter limit) takes effect
# within it. A look reads the live view and the database only, never Home Assistant.
LOOK_SECONDS: Final = 2.0
AUDIT_GROUP: Final = "farmhost"
# An off HA accepts while the entity stays on is tried again at the next looks, then given up (and the chat told).
GIVE_UP_AFTER: Final = 3
AUDIT_ACTION: Final = "auto_off"
# How long start() waits for the live view's first sync before looking anyway (offs then wait for the view).
FIRST_SYNC_SECONDS: Final = 30.0


# The service that ends an on-period, by domain (every other domain: turn_off).
OFF_SERVICES: Final = {"valve": "close_valve", "cover": "close_cover"}


@dataclass(frozen=True)
class _Seen:
    on: bool | None  # None: HA does not know (unavailable/unknown) and farmhost never saw it on or off
    since: datetime | None  # when farmhost first saw it in that state
    name: str
    after_off: bool  # farmhost saw it off before this on-period (else `since` is HA's last_changed at most)


class AutoOff:
    """The watcher; one per daemon with Home Assistant configured."""

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
        clock: Callable[[], datetime] = now_utc,
        interval: float = LOOK_SECONDS,
    ) -> None:
        self._ha = ha
        self._view = view
        self._db = db
        self._rules = ProfileRules(profile_path, who="auto-off")
        self._audit = audit
        self._started_at = started_at
        self._wake = wake_outbox
        self._clock = clock
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._nudge = asyncio.Event()
        self._failing: set[str] = set()  # entities whose off failed last time (logged once per streak)
        self._tries: dict[tuple[str, datetime], int] = {}  # offs HA accepted but the entity stayed on

    async def start(self) -> None:
        """Re-arm offs a stop interrupted, follow the live view, then look in the background."""
        with self._db.tx() as conn:
            if released := auto_off.release_claims(conn):
                logger.warning("auto-off: %d off(s) interrupted by a stop are tried again", released)
        self._view.add_listener(self._changed)
        self._task = asyncio.create_task(self._run(), name="auto-off")

    async def stop(self) -> None:
        """Stop looking (armed offs stay in the database for the next start)."""
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        await self._view.wait_synced(FIRST_SYNC_SECONDS)
        while True:
            try:
                wait = await self.look()
            except Exception:  # one bad round must not end the watcher for the life of the daemon
                logger.exception("auto-off: a look failed; trying again in %g s", self._interval)
                wait = self._interval
            self._nudge.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._nudge.wait()

    def _changed(self, change: StateChange) -> None:
        """An observed off ends the on-period at once; an observed on is armed at once (not at the next look)."""
        if change.new.on is False or (change.new.on and (change.old is None or change.old.on is not True)):
            self._nudge.set()

    async def look(self) -> float:
        """One round: arm what is on, cancel what went off, turn off what is due; returns the seconds to the next."""
        limited = [rule for rule in self._rules.current() if rule.maxOnSeconds is not None]
        with self._db.tx() as conn:
            armed = auto_off.live(conn)
        if (not limited and not armed) or not self._view.connected:
            return self._interval
        seen = {entity_id: _seen(view) for entity_id, view in self._view.entities().items()}
        now = self._clock()
        with self._db.tx() as conn:
            self._reconcile(conn, limited, armed, seen, now)
            due = auto_off.claim_due(conn, {e for e, s in seen.items() if s.on}, at=now)
            upcoming = [row.off_at for row in auto_off.live(conn).values() if row.status == "armed"]
        for row in due:
            await self._turn_off(row, seen[row.entity_id], now)
        if due:
            return 0.0  # look again at once: an off HA did not follow is retried, the next row armed
        soonest = min(((at - self._clock()).total_seconds() for at in upcoming), default=self._interval)
        return max(0.0, min(self._interval, soonest))

    def _reconcile(
        self,
        conn: sqlite3.Connection,
        limited: list[ActuatorRule],
        armed: dict[str, AutoOffRow],
        seen: dict[str, _Seen],
        now: datetime,
    ) -> None:
        for entity_id, row in armed.items():
            state = seen.get(entity_id)
            if not any(rules.covers_entity(rule, entity_id) for rule in limited):
                auto_off.cancel(conn, entity_id, at=now, outcome="no maxOnSeconds rule covers it any more")
            elif state is not None and state.on is False:
                auto_off.cancel(conn, entity_id, at=now, outcome="it was turned off before its time")
                logger.info("auto-off: %s went off before its time; nothing to do", entity_id)
            elif state is not None and state.on and state.after_off and state.since and state.since > row.on_since:
                # farmhost saw it go off and on again since the row was armed: a new on-period. (A later
                # last_changed alone, after farmhost was down, never re-times: a reload or a restart re-stamps it.)
                auto_off.cancel(conn, entity_id, at=now, outcome="it went off and on again; timed anew")
        for entity_id, state in seen.items():
            if not state.on or state.since is None:
                continue
            limits = [
                rule.maxOnSeconds for rule in limited if rule.maxOnSeconds and rules.covers_entity(rule, entity_id)
            ]
            if not limits:
                continue
            limit = min(limits)
            off_at = state.since + timedelta(seconds=limit)
            if auto_off.arm(conn, entity_id, on_since=state.since, off_at=off_at, max_on=limit):
                logger.info("auto-off: %s is on since %s; off at %s", entity_id, state.since, off_at)
            else:
                auto_off.tighten(conn, entity_id, off_at=off_at, max_on=limit)

    async def _turn_off(self, row: AutoOffRow, state: _Seen, now: datetime) -> None:
        domain = row.entity_id.split(".", 1)[0]
        service = OFF_SERVICES.get(domain, "turn_off")
        started = self._clock()
        try:
            await self._ha.call_service(domain, service, {"entity_id": row.entity_id})
        except HaError as err:
            with self._db.tx() as conn:
                auto_off.release(conn, row)
            if row.entity_id not in self._failing:
                logger.warning("auto-off: %s.%s on %s failed (%s); trying again", domain, service, row.entity_id, err)
                self._failing.add(row.entity_id)
                self._record(row, domain, service, started, failed=True)
            return
        self._failing.discard(row.entity_id)
        if await self._still_on(row):
            tries = self._tries[(row.entity_id, row.on_since)] = self._tries.get((row.entity_id, row.on_since), 0) + 1
            if tries < GIVE_UP_AFTER:
                with self._db.tx() as conn:
                    auto_off.release(conn, row)
                return
            text = (
                f"farmhost tried {tries} times to turn off {state.name} (on for longer than the farm profile's limit), "
                "and Home Assistant still reports it on: check the device and its wiring now."
            )
            outcome = f"{domain}.{service}: still on after {tries} tries"
        else:
            late = row.off_at < self._started_at
            text = _told(row, state.name, service, late=late, on_for=self._clock() - row.on_since)
            outcome = f"{domain}.{service}" + (" (late)" if late else "")
        self._tries.pop((row.entity_id, row.on_since), None)
        with self._db.tx() as conn:
            auto_off.finish(conn, row, at=self._clock(), outcome=outcome)
            main = groups.main_group(conn)
            if main is not None:
                with contextlib.suppress(sqlite3.IntegrityError):  # told already (a restart mid-way)
                    key = f"auto-off:{row.entity_id}:{row.on_since.isoformat()}"
                    enqueue_notice(conn, key=key, jid=main.jid, text=text, at=now, reply_markup=stop_keyboard())
        self._wake()
        self._record(row, domain, service, started, failed=False)
        logger.warning("auto-off: %s", text)

    async def _still_on(self, row: AutoOffRow) -> bool:
        """HA reports the entity on right after the off HA accepted (a relay that did not follow)."""
        try:
            after = await self._ha.get_state(row.entity_id)
        except HaError:
            return False  # it answered the off; the view shows the truth and a new on-period is armed if needed
        return is_on(row.entity_id, after.get("state")) is True

    def _record(self, row: AutoOffRow, domain: str, service: str, started: datetime, *, failed: bool) -> None:
        self._audit.record(
            at=started,
            group=AUDIT_GROUP,
            request_id=f"auto-off:{row.entity_id}:{row.on_since.isoformat()}",
            action=AUDIT_ACTION,
            params={"entity_id": row.entity_id, "service": f"{domain}.{service}", "maxOnSeconds": row.max_on_seconds},
            error_code=ErrorCode.UPSTREAM_UNAVAILABLE if failed else None,
            duration_ms=int((self._clock() - started).total_seconds() * 1000),
            extra={"onSince": row.on_since.isoformat(), "offAt": row.off_at.isoformat()},
        )


def _seen(view: EntityView) -> _Seen:
    since = view.on_since
    if since is not None:  # to the millisecond, as the database keeps it: the same on-period compares equal to its row
        since = since.replace(microsecond=since.microsecond // 1000 * 1000)
    return _Seen(on=view.on, since=since, name=view.name, after_off=view.after_off)


def _duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _told(row: AutoOffRow, name: str, service: str, *, late: bool, on_for: timedelta) -> str:
    limit = _duration(row.max_on_seconds)
    what = "closed" if service.startswith("close") else "turned off"
    if late:
        return (
            f"farmhost {what} {name}: it was on since {row.on_since:%H:%M} UTC and the farm profile allows {limit}. "
            f"farmhost was not running at {row.off_at:%H:%M} UTC, when it was due; it did it now that it is back."
        )
    return (
        f"farmhost {what} {name}: it had been on for {_duration(on_for.total_seconds())} "
        f"(since {row.on_since:%H:%M:%S} UTC), and the farm profile allows {limit}."
    )
