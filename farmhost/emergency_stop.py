"""The emergency stop: every guarded entity to its safe state at once, agents paused, pending approvals denied.

`/stop` in the main chat and the Stop everything button (farmhost/outbox/stop_messages.py) both land here. In this
order: agent runs are paused with the same stored pause as the MQTT `Agents paused` switch (runs going on are
ended, none starts until `/resume`, a restart keeps it), every pending approval is denied (nothing waits to be
pressed into action), and then every entity among Home Assistant's current states that a farm profile rule guards
(names by an entity glob, or covers by a service of its domain: `{"services": ["light.*"]}` every light;
farm/control/effects.py) is sent to its safe state (farm/control/safe_state.py). The calls are grouped by service
(one `switch.turn_off` naming every switch, ...), so Home Assistant acts on the entities of a call concurrently;
each call has its own timeout, and one that fails or hangs does not keep the next ones from being sent. Afterwards the states are read until every
entity is safe or VERIFY_SECONDS have passed: what the report says was turned off is what HA reports, not
what was asked. Failures are reported, never fatal. `/resume` lifts the pause only; it never turns anything on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from farmhost.agents.pause import STOPPED_IN_CHAT, set_paused
from farmhost.farm.audit import AuditLog
from farmhost.farm.control import policy
from farmhost.farm.control.effects import guarded
from farmhost.farm.control.rules import ActuatorRule
from farmhost.farm.control.safe_state import SafeTarget, is_safe_state, safe_target
from farmhost.farm.homeassistant.client import HAClient
from farmhost.farm.homeassistant.errors import HaError
from farmhost.farm.homeassistant.names import friendly_name
from farmhost.outbox.notices import enqueue_notice
from farmhost.protocol.codes import ErrorCode
from farmhost.store import approvals as store
from farmhost.store import groups
from farmhost.store.approvals import ApprovalRow
from farmhost.store.db import Database, now_utc

if TYPE_CHECKING:
    from farmhost.agents.runtime import AgentRuntime

logger = logging.getLogger(__name__)

AUDIT_GROUP: Final = "farmhost"
STOP_ACTION: Final = "emergency_stop"
RESUME_ACTION: Final = "emergency_resume"
# One service call waits at most this long: a relay that hangs must not keep the report (and the chat) waiting
# for HAClient's 10 s; what it did is read back from the states anyway.
CALL_TIMEOUT: Final = 5.0
# Reading HA's states (before and while verifying) waits at most this long each time.
READ_TIMEOUT: Final = 5.0
# Template switches and slow relays report their new state a moment after the call returns; this is how long
# the stop waits for HA to report every entity safe before it names the ones that are not.
VERIFY_SECONDS: Final = 3.0
# Between two reads while verifying: short, the stop is measured by when the last entity is safe.
VERIFY_INTERVAL: Final = 0.05


@dataclass(frozen=True, kw_only=True)
class EntityOutcome:
    """What the stop did to one guarded entity."""

    entity_id: str
    name: str  # the friendly name, or the entity id
    safe: str  # the safe state, as words ("off", "closed", "0")
    before: str | None  # the state HA reported before the stop
    after: str | None  # the state HA reported after it
    error: str | None = None  # why it is not safe (None: it is)


@dataclass(frozen=True, kw_only=True)
class StopReport:
    """The outcome of one emergency stop, for the chat and the audit."""

    by: str
    at: datetime
    pause_reason: str
    made_safe: list[EntityOutcome] = field(default_factory=list)
    already_safe: list[EntityOutcome] = field(default_factory=list)
    failed: list[EntityOutcome] = field(default_factory=list)
    no_safe_state: list[str] = field(default_factory=list)  # guarded, but a select/button without safeState
    denied: list[ApprovalRow] = field(default_factory=list)
    problem: str | None = None  # why nothing could be switched at all (HA off or unreadable, profile broken)


@dataclass(frozen=True, kw_only=True)
class ResumeReport:
    """The outcome of `/resume`: whether agents were paused, and why they were."""

    by: str
    was: str | None  # the pause it lifted (None: agents were not paused)


def stop_reason(by: str, at: datetime) -> str:
    """The pause reason /status, doctor and refused runs show: `stopped by /stop (who, when)`."""
    return f"{STOPPED_IN_CHAT} ({by}, {at:%Y-%m-%d %H:%M} UTC)"


class EmergencyStop:
    """The stop and resume of one daemon (the Telegram command, the button and the benchmark share it)."""

    def __init__(
        self,
        *,
        db: Database,
        runtime: AgentRuntime,
        ha: HAClient | None,
        profile_path: Path,
        audit: AuditLog,
        wake_outbox: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._db = db
        self._runtime = runtime
        self._ha = ha
        self._profile_path = profile_path
        self._audit = audit
        self._wake = wake_outbox
        self._clock = clock

    async def stop(self, *, by: str, via: str) -> StopReport:
        """Pause agents, deny pending approvals, put every guarded entity in its safe state; never raises for HA.

        Args:
            by: who asked (@username or name), for the chat, the audit and the pause reason.
            via: how (`/stop`, `button`), for the audit.
        """
        started = time.monotonic()
        at = self._clock()
        reason = stop_reason(by, at)
        set_paused(self._db, self._runtime, True, by=by, at=at, reason=reason)
        denied = self._deny_pending(by, at)
        outcomes, no_safe, problem = await self._make_safe()
        report = StopReport(
            by=by,
            at=at,
            pause_reason=reason,
            made_safe=[o for o in outcomes if o.error is None and o.before != o.after],
            already_safe=[o for o in outcomes if o.error is None and o.before == o.after],
            failed=[o for o in outcomes if o.error is not None],
            no_safe_state=no_safe,
            denied=denied,
            problem=problem,
        )
        self._record(report, via, started)
        if denied:
            self._wake()
        logger.warning(
            "emergency stop by %s: %d made safe, %d already safe, %d failed, %d approval(s) denied%s",
            by,
            len(report.made_safe),
            len(report.already_safe),
            len(report.failed),
            len(denied),
            f"; {problem}" if problem else "",
        )
        return report

    def resume(self, *, by: str) -> ResumeReport:
        """Lift the pause (whoever set it); nothing is turned back on. Audited."""
        at = self._clock()
        was = self._runtime.paused
        set_paused(self._db, self._runtime, False, by=by, at=at, lifts_stop=True)
        self._audit.record(
            at=at,
            group=AUDIT_GROUP,
            request_id=f"resume:{at.isoformat()}",
            action=RESUME_ACTION,
            params={"wasPaused": was},
            error_code=None,
            duration_ms=0,
            extra={"by": by},
        )
        logger.warning("agents resumed by %s (were: %s)", by, was or "not paused")
        return ResumeReport(by=by, was=was)

    def _deny_pending(self, by: str, at: datetime) -> list[ApprovalRow]:
        """Deny every pending approval, telling each asking group (the same message key the desk uses)."""
        outcome = f"denied by the emergency stop ({by}); nothing was done"
        denied: list[ApprovalRow] = []
        with self._db.tx() as conn:
            for row in store.all_pending(conn):
                if not store.decide(conn, row.id, status="denied", by=by, at=at, outcome=outcome):
                    continue  # past its time: the desk's sweep expires it and says so
                denied.append(row)
                group = groups.get_group(conn, row.group_folder)
                if group is not None:
                    text = f"Approval {row.id} ({row.summary}): {outcome}."
                    with contextlib.suppress(sqlite3.IntegrityError):  # told already
                        enqueue_notice(conn, key=f"approval-outcome:{row.id}", jid=group.jid, text=text, at=at)
        return denied

    async def _make_safe(self) -> tuple[list[EntityOutcome], list[str], str | None]:
        loaded = policy.load_profile(self._profile_path)
        if loaded.problem is not None:
            return [], [], f"{loaded.problem}, so farmhost cannot tell which devices are guarded"
        rules = loaded.rules
        if self._ha is None:
            return [], [], "Home Assistant is not configured (HA_URL / HA_TOKEN)"
        if not rules:
            return [], [], None
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                states = await self._ha.get_states()
        except (HaError, TimeoutError) as err:
            return [], [], f"Home Assistant could not be read ({_why(err)}); check the devices by hand"
        by_id = {s["entity_id"]: s for s in states if isinstance(s.get("entity_id"), str)}
        targets: list[SafeTarget] = []
        no_safe: list[str] = []
        for entity_id in guarded(rules, by_id):
            target = safe_target(entity_id, rules, by_id[entity_id].get("attributes") or {})
            if target is None:
                no_safe.append(entity_id)
            else:
                targets.append(target)
        errors = await self._call_all(targets)
        after = await self._verify(targets, rules)
        outcomes = [
            _outcome(target, by_id[target.entity_id], after.get(target.entity_id), rules, errors) for target in targets
        ]
        return outcomes, no_safe, None

    async def _call_all(self, targets: list[SafeTarget]) -> dict[str, str]:
        """Send every target its safe call, one call per service; the error of each entity whose call failed."""
        batches: dict[tuple[str, str, str], list[str]] = {}
        for target in targets:
            key = (target.domain, target.service, json.dumps(target.data, sort_keys=True))
            batches.setdefault(key, []).append(target.entity_id)
        errors: dict[str, str] = {}
        # One after the other: HAClient sends WebSocket commands one at a time anyway, and a timeout started
        # while waiting for the socket would fail the calls queued behind a hanging one.
        for key, ids in batches.items():
            error = await self._call(key, ids)
            if error is not None:
                errors.update(dict.fromkeys(ids, error))
        return errors

    async def _call(self, key: tuple[str, str, str], entity_ids: list[str]) -> str | None:
        assert self._ha is not None
        domain, service, data = key
        service_data = {**json.loads(data), "entity_id": entity_ids}
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                await self._ha.ws_command("call_service", domain=domain, service=service, service_data=service_data)
        except (HaError, TimeoutError) as err:
            logger.error("emergency stop: %s.%s on %s failed: %s", domain, service, ", ".join(entity_ids), _why(err))
            return f"{domain}.{service} failed: {_why(err)}"
        except Exception:  # a bug in one call must not keep the others from being sent, nor the answer from coming
            logger.exception("emergency stop: %s.%s on %s failed", domain, service, ", ".join(entity_ids))
            return f"{domain}.{service} failed inside farmhost (see the host log)"
        return None

    async def _verify(self, targets: list[SafeTarget], rules: tuple[ActuatorRule, ...]) -> dict[str, dict[str, Any]]:
        """HA's states of the targets, read again until every one is safe or VERIFY_SECONDS have passed."""
        assert self._ha is not None
        deadline = time.monotonic() + VERIFY_SECONDS
        wanted = {target.entity_id for target in targets}
        seen: dict[str, dict[str, Any]] = {}
        while wanted:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    states = await self._ha.get_states()
            except (HaError, TimeoutError) as err:
                logger.warning("emergency stop: reading the states back failed: %s", _why(err))
            else:
                seen = {s["entity_id"]: s for s in states if s.get("entity_id") in wanted}
                if all(_safe(e, seen.get(e), rules) for e in wanted) or time.monotonic() >= deadline:
                    return seen
            if time.monotonic() >= deadline:
                return seen
            await asyncio.sleep(VERIFY_INTERVAL)
        return seen

    def _record(self, report: StopReport, via: str, started: float) -> None:
        failed = {o.entity_id: o.error for o in report.failed}
        self._audit.record(
            at=report.at,
            group=AUDIT_GROUP,
            request_id=f"stop:{report.at.isoformat()}",
            action=STOP_ACTION,
            params={
                "madeSafe": [o.entity_id for o in report.made_safe],
                "alreadySafe": [o.entity_id for o in report.already_safe],
                "failed": failed,
                "noSafeState": report.no_safe_state,
                "approvalsDenied": [row.id for row in report.denied],
                "problem": report.problem,
            },
            error_code=ErrorCode.UPSTREAM_ERROR if failed or report.problem else None,
            duration_ms=int((time.monotonic() - started) * 1000),
            extra={"by": report.by, "via": via},
        )


def _safe(entity_id: str, state: Mapping[str, Any] | None, rules: tuple[ActuatorRule, ...]) -> bool:
    if state is None:
        return False
    return is_safe_state(entity_id, state.get("state"), rules, state.get("attributes") or {})


def _outcome(
    target: SafeTarget,
    before: Mapping[str, Any],
    after: Mapping[str, Any] | None,
    rules: tuple[ActuatorRule, ...],
    errors: Mapping[str, str],
) -> EntityOutcome:
    name = friendly_name(before.get("attributes") or {})
    was = before.get("state")
    now = after.get("state") if after is not None else None
    safe_words = f"{target.state:g}" if isinstance(target.state, float) else target.state
    error: str | None = None
    if not _safe(target.entity_id, after, rules):
        reported = f"Home Assistant still reports {now!r}" if now is not None else "its state could not be read"
        error = f"{reported} ({errors[target.entity_id]})" if target.entity_id in errors else reported
    return EntityOutcome(
        entity_id=target.entity_id,
        name=name or target.entity_id,
        safe=safe_words,
        before=was if isinstance(was, str) else None,
        after=now if isinstance(now, str) else None,
        error=error,
    )


def _why(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return "Home Assistant did not answer in time"
    return str(err)
