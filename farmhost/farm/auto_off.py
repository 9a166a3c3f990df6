"""Automatic off: farmhost turns off what a `maxOnSeconds` rule covers once it has been on that long.

The watcher looks at Home Assistant's states every few seconds (only while the profile has such rules or an
off is still pending), so it sees an entity switched on by anything: an agent, a scheduled task, an
automation, a hand on the wall switch. Each on-period gets a durable row (`store/auto_off.py`) with its off
time (`last_changed` + the limit), claimed once when the time comes; after a crash or a power cut the row is
still there and the entity is turned off as soon as farmhost is back, and the main chat is told why late. An
entity that goes off some other way before its time cancels its row. Home Assistant away or refusing: the
off is tried again at the next look.
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
from typing import Any, Final

from farmhost.background import cancel_and_wait, every
from farmhost.farm import policy, rules
from farmhost.farm.audit import AuditLog
from farmhost.farm.ha_errors import HaError
from farmhost.farm.homeassistant import HAClient
from farmhost.farm.rules import ActuatorRule
from farmhost.protocol.codes import ErrorCode
from farmhost.store import auto_off, groups
from farmhost.store.auto_off import AutoOffRow
from farmhost.store.db import Database, now_utc
from farmhost.telegram.notices import enqueue_notice

logger = logging.getLogger(__name__)

# A pump on for a few seconds too long floods nothing; one /api/states call every 2 s costs HA little.
LOOK_SECONDS: Final = 2.0
AUDIT_GROUP: Final = "farmhost"
# An off HA accepts while the entity stays on is tried again at the next looks, then given up (and the chat told).
GIVE_UP_AFTER: Final = 3
AUDIT_ACTION: Final = "auto_off"
# The state an entity is "on" in, and the service that ends it, by domain (everything else: turn_off on "on").
_ON_STATES: Final = {"valve": frozenset({"open", "opening"}), "cover": frozenset({"open", "opening"})}
_OFF_SERVICES: Final = {"valve": "close_valve", "cover": "close_cover"}
_DEFAULT_ON: Final = frozenset({"on"})
_UNKNOWN: Final = frozenset({"unavailable", "unknown"})


@dataclass(frozen=True)
class _Seen:
    on: bool | None  # None: HA does not know (unavailable/unknown)
    since: datetime | None
    name: str


class AutoOff:
    """The watcher; one per daemon with Home Assistant configured."""

    def __init__(
        self,
        *,
        ha: HAClient,
        db: Database,
        profile_path: Path,
        audit: AuditLog,
        started_at: datetime,
        wake_outbox: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = now_utc,
        interval: float = LOOK_SECONDS,
    ) -> None:
        self._ha = ha
        self._db = db
        self._profile_path = profile_path
        self._audit = audit
        self._started_at = started_at
        self._wake = wake_outbox
        self._clock = clock
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._profile_stamp: tuple[int, int] | None = None
        self._rules: tuple[ActuatorRule, ...] = ()
        self._failing: set[str] = set()  # entities whose off failed last time (logged once per streak)
        self._tries: dict[tuple[str, datetime], int] = {}  # offs HA accepted but the entity stayed on
        self._ha_away = False

    async def start(self) -> None:
        """Re-arm offs a stop interrupted, then look in the background."""
        with self._db.tx() as conn:
            if released := auto_off.release_claims(conn):
                logger.warning("auto-off: %d off(s) interrupted by a stop are tried again", released)
        self._task = asyncio.create_task(every(self._interval, self.look, first_now=True), name="auto-off")

    async def stop(self) -> None:
        """Stop looking (armed offs stay in the database for the next start)."""
        await cancel_and_wait(self._task)
        self._task = None

    async def look(self) -> None:
        """One round: arm what is on, cancel what went off, turn off what is due."""
        limited = [rule for rule in self._current_rules() if rule.maxOnSeconds is not None]
        with self._db.tx() as conn:
            armed = auto_off.live(conn)
        if not limited and not armed:
            return
        try:
            states = await self._ha.get_states()
        except HaError as err:
            if not self._ha_away:
                logger.warning("auto-off: Home Assistant cannot be read (%s); offs wait until it can", err)
                self._ha_away = True
            return
        if self._ha_away:
            logger.info("auto-off: Home Assistant answers again")
            self._ha_away = False
        seen = {state["entity_id"]: _seen(state) for state in states if isinstance(state.get("entity_id"), str)}
        now = self._clock()
        with self._db.tx() as conn:
            self._reconcile(conn, limited, armed, seen, now)
            due = auto_off.claim_due(conn, {e for e, s in seen.items() if s.on}, at=now)
        for row in due:
            await self._turn_off(row, seen[row.entity_id], now)

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
            elif state is not None and state.on and state.since is not None and state.since > row.on_since:
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
        service = _OFF_SERVICES.get(domain, "turn_off")
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
            text = _told(row, state.name, service, late=late)
            outcome = f"{domain}.{service}" + (" (late)" if late else "")
        self._tries.pop((row.entity_id, row.on_since), None)
        with self._db.tx() as conn:
            auto_off.finish(conn, row, at=self._clock(), outcome=outcome)
            main = groups.main_group(conn)
            if main is not None:
                with contextlib.suppress(sqlite3.IntegrityError):  # told already (a restart mid-way)
                    key = f"auto-off:{row.entity_id}:{row.on_since.isoformat()}"
                    enqueue_notice(conn, key=key, jid=main.jid, text=text, at=now)
        self._wake()
        self._record(row, domain, service, started, failed=False)
        logger.warning("auto-off: %s", text)

    async def _still_on(self, row: AutoOffRow) -> bool:
        """HA reports the entity on, in the same on-period, right after the off (a relay that did not follow)."""
        try:
            after = _seen(await self._ha.get_state(row.entity_id))
        except HaError:
            return False  # it answered the off; the next look sees the truth and arms a new period if needed
        return bool(after.on) and after.since == row.on_since

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

    def _current_rules(self) -> tuple[ActuatorRule, ...]:
        """The profile's rules, parsed again only when the file changed; a broken file keeps the last good rules."""
        try:
            info = self._profile_path.stat()
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp == self._profile_stamp:
            return self._rules
        self._profile_stamp = stamp
        loaded = policy.load_profile(self._profile_path)
        if loaded.problem is not None:
            logger.error("auto-off: %s; the last valid rules stay in force", loaded.problem)
            return self._rules
        self._rules = loaded.rules
        return self._rules


def _seen(state: dict[str, Any]) -> _Seen:
    entity_id: str = state["entity_id"]
    domain = entity_id.split(".", 1)[0]
    value = state.get("state")
    name = (state.get("attributes") or {}).get("friendly_name")
    shown = f"{name} ({entity_id})" if isinstance(name, str) and name else entity_id
    on: bool | None = (
        None if value in _UNKNOWN or not isinstance(value, str) else value in _ON_STATES.get(domain, _DEFAULT_ON)
    )
    since: datetime | None = None
    with contextlib.suppress(TypeError, ValueError):
        exact = datetime.fromisoformat(state["last_changed"])
        # To the millisecond, as the database keeps it: the same on-period must compare equal to its row.
        since = exact.replace(microsecond=exact.microsecond // 1000 * 1000)
    return _Seen(on=on, since=since, name=shown)


def _told(row: AutoOffRow, name: str, service: str, *, late: bool) -> str:
    minutes = row.max_on_seconds / 60
    limit = f"{minutes:g} min" if row.max_on_seconds >= 60 else f"{row.max_on_seconds} s"
    what = "closed" if service.startswith("close") else "turned off"
    if late:
        return (
            f"farmhost {what} {name}: it was on since {row.on_since:%H:%M} UTC and the farm profile allows {limit}. "
            f"farmhost was not running at {row.off_at:%H:%M} UTC, when it was due; it did it now that it is back."
        )
    return f"farmhost {what} {name}: it had been on for {limit} (since {row.on_since:%H:%M} UTC), the farm profile's limit."
