"""The morning report: at FARMHOST_DAILY_REPORT the main chat gets the last 24 h in a few lines, once per farm day.

No LLM is needed: alerts raised and resolved (alerts.json), how long each guarded actuator ran (HA's recorder,
through ha_history's own code), tasks run and failed, approvals, and LLM use against the budget. The outbox key
`daily-report:<farm date>` makes it exactly once per day across restarts; a farmhost started after the hour sends
that day's report at start. With FARMHOST_DAILY_REPORT_BY_AGENT the main group's agent writes it from the same
facts; if that run fails, the plain report goes instead. Idle, the service sleeps until the next report's time.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from farmhost.errors import FarmhostError
from farmhost.farm.control import policy
from farmhost.farm.state.alerts import AlertBook
from farmhost.farm.state.collector import ALERTS
from farmhost.farm.state.history import entity_summaries
from farmhost.store import approvals as approval_rows
from farmhost.store import groups, llm_usage, outbox, task_runs
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from zoneinfo import ZoneInfo

    from farmhost.agents.limits import LimitsReader
    from farmhost.agents.runtime import AgentRuntime
    from farmhost.config import ReportSettings
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.layout import DataLayout
    from farmhost.store.db import Database

logger = logging.getLogger(__name__)

PERIOD: Final = timedelta(hours=24)
KEY_PREFIX: Final = "daily-report:"
# Actuators whose on-time is reported: what a rule guards and what runs (switched on and off).
ACTUATOR_DOMAINS: Final = frozenset({"switch", "valve", "fan", "light", "input_boolean", "climate", "cover"})
# A report names at most this many of each kind; a farm with more says "and N more".
MAX_ITEMS: Final = 8
# The loop looks at the wall clock at least this often, so a clock step (NTP at boot) is noticed within it.
LOOK_SECONDS: Final = 30.0


@dataclass(frozen=True, kw_only=True)
class ReportFacts:
    """What the last 24 h held, as the report tells it."""

    start: datetime
    end: datetime
    raised: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    still_active: int = 0
    actuators: list[tuple[str, int, int]] = field(default_factory=list)  # (entity id, seconds on, times turned on)
    history_problem: str | None = None
    tasks_run: int = 0
    tasks_failed: list[str] = field(default_factory=list)
    approvals: dict[str, int] = field(default_factory=dict)
    llm: list[tuple[str, int, int, int]] = field(default_factory=list)  # (folder, requests, tokens, tokens budget)


def report_key(day: str) -> str:
    """The outbox key of one farm day's report."""
    return f"{KEY_PREFIX}{day}"


def report_text(facts: ReportFacts, zone: ZoneInfo) -> str:
    """The plain report: one short paragraph per kind of fact."""
    start, end = facts.start.astimezone(zone), facts.end.astimezone(zone)
    lines = [f"Good morning. The farm from {start:%a %H:%M} to {end:%a %H:%M}:"]
    if facts.raised or facts.resolved:
        lines.append(
            f"Alerts: {len(facts.raised)} raised, {len(facts.resolved)} resolved, {facts.still_active} active now."
        )
        lines += [f"• raised: {m}" for m in _few(facts.raised)] + [f"• resolved: {m}" for m in _few(facts.resolved)]
    else:
        lines.append(f"Alerts: none raised or resolved; {facts.still_active} active now.")
    if facts.history_problem:
        lines.append(f"Actuators: not known ({facts.history_problem}).")
    elif facts.actuators:
        lines.append("Actuators ran:")
        lines += [f"• {name}: {_duration(on)} on, turned on {n}×" for name, on, n in facts.actuators[:MAX_ITEMS]]
    failed = f", {len(facts.tasks_failed)} failed ({', '.join(_few(facts.tasks_failed))})" if facts.tasks_failed else ""
    lines.append(f"Tasks: {facts.tasks_run} run{failed}.")
    if facts.approvals:
        asked = ", ".join(f"{n} {status}" for status, n in sorted(facts.approvals.items()))
        lines.append(f"Approvals: {asked}.")
    if facts.llm:
        used = "; ".join(
            f"{folder} {req} requests, {tok:,} of {budget:,} tokens" for folder, req, tok, budget in facts.llm
        )
        lines.append(f"LLM use yesterday: {used}.")
    else:
        lines.append("LLM use yesterday: none.")
    return "\n".join(lines)


async def gather_facts(
    *,
    db: Database,
    layout: DataLayout,
    settings: ReportSettings,
    ha: HAClient | None,
    limits: LimitsReader,
    end: datetime,
) -> ReportFacts:
    """The facts of the 24 h before `end`, from the farm state, HA's recorder and the store."""
    start = end - PERIOD
    zone = settings.zone
    book = _alerts(layout)
    raised = [a for a in (*book.active, *book.resolved) if start <= a.since <= end]
    resolved = [a for a in book.resolved if a.resolved_at is not None and start <= a.resolved_at <= end]
    actuators: list[tuple[str, int, int]] = []
    problem: str | None = None
    if ha is None:
        problem = "Home Assistant is not configured"
    else:
        try:
            actuators = await _actuators(ha, settings.profile_path, start, end, zone)
        except FarmhostError as err:
            problem = err.message
    with db.tx() as conn:
        tasks_run, tasks_failed = _tasks(conn, start, end)
        approvals = approval_rows.count_by_status_between(conn, start, end)
        llm = _llm(conn, limits, (end.astimezone(zone) - timedelta(days=1)).date().isoformat())
    return ReportFacts(
        start=start,
        end=end,
        raised=[a.message for a in raised],
        resolved=[a.message for a in resolved],
        still_active=len(book.active),
        actuators=actuators,
        history_problem=problem,
        tasks_run=tasks_run,
        tasks_failed=tasks_failed,
        approvals=approvals,
        llm=llm,
    )


class DailyReport:
    """Sends the morning report when it is due; one per daemon, started only when FARMHOST_DAILY_REPORT is set."""

    def __init__(
        self,
        *,
        db: Database,
        layout: DataLayout,
        settings: ReportSettings,
        ha: HAClient | None,
        limits: LimitsReader,
        wake_outbox: Callable[[], None],
        runtime: AgentRuntime | None = None,
        clock: Callable[[], datetime] = now_utc,
        look_seconds: float = LOOK_SECONDS,
    ) -> None:
        self._db, self._layout, self._settings, self._ha = db, layout, settings, ha
        self._look = look_seconds
        self._queued_day: str | None = None  # the farm day whose report is in the outbox (no database look again)
        self._limits = limits
        self._wake = wake_outbox
        self._runtime = runtime
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Send today's report if it is due and was not sent, then wait for the next one (nothing when off)."""
        if self._settings.at is not None and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="daily-report")

    async def stop(self) -> None:
        """Stop waiting (a report being written is abandoned; it is sent at the next start, still once)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def send_due(self) -> bool:
        """Queue today's report when its time has come and it was not queued before; True when it was queued now."""
        now = self._clock()
        due = self._due_at(now)
        if now < due:
            return False
        day = due.astimezone(self._settings.zone).date().isoformat()
        if day == self._queued_day:
            return False
        with self._db.tx() as conn:
            main = groups.main_group(conn)
            if main is None:
                return False
            if outbox.has_key(conn, report_key(day)):
                logger.info("daily report for %s: queued before, not again", day)
                self._queued_day = day
                return False
        facts = await gather_facts(
            db=self._db, layout=self._layout, settings=self._settings, ha=self._ha, limits=self._limits, end=now
        )
        text = report_text(facts, self._settings.zone)
        if self._settings.by_agent and self._runtime is not None:
            text = await self._by_agent(main.folder, main.jid, text) or text
        with self._db.tx() as conn:
            if outbox.has_key(conn, report_key(day)):
                self._queued_day = day
                return False
            # The host's own message (source_folder None): it goes ahead of an agents' backlog in the main chat and
            # is not counted against the main group's share of the outbox.
            outbox.enqueue(conn, message_key=report_key(day), chat_jid=main.jid, source_folder=None,
                           chunks=[text], at=now)  # fmt: skip
        self._queued_day = day
        self._wake()
        logger.info("daily report for %s queued for %s", day, main.jid)
        return True

    async def _loop(self) -> None:
        while True:
            try:
                await self.send_due()
            except Exception:
                logger.exception("daily report: could not be sent; trying again at the next report time")
            now = self._clock()
            due = self._due_at(now)
            following = due if now < due else self._due_at(now + timedelta(days=1))
            # Never one long sleep: asyncio sleeps on the monotonic clock, and a Pi without a real-time clock boots
            # on a stale wall clock that NTP steps later; one nap computed before the step would miss that day.
            await asyncio.sleep(min(self._look, max(1.0, (following - now).total_seconds())))

    def _due_at(self, now: datetime) -> datetime:
        """The report's time on the farm day of `now`."""
        assert self._settings.at is not None
        local = now.astimezone(self._settings.zone)
        return datetime.combine(local.date(), self._settings.at, tzinfo=self._settings.zone)

    async def _by_agent(self, folder: str, jid: str, facts: str) -> str | None:
        from farmhost.agents.jobs import AgentJob

        assert self._runtime is not None
        prompt = (
            "Write the farmer's morning report for the chat: short, plain words, the important first. Use only these "
            f"facts, gathered by farmhost just now:\n\n{facts}"
        )
        job = AgentJob(folder=folder, prompt=prompt, scheduled=True, context_mode="isolated", chat_jid=jid)
        outcome = await self._runtime.submit(job)
        if outcome.status == "ok" and (outcome.answer or "").strip():
            return (outcome.answer or "").strip()
        logger.warning("daily report: the agent did not write it (%s); the plain report is sent", outcome.error)
        return None


# helpers ---------------------------------------------------------------------------------------------


def _alerts(layout: DataLayout) -> AlertBook:
    try:
        return AlertBook.from_json(json.loads((layout.farm_state / ALERTS).read_text()))
    except (OSError, ValueError, TypeError):
        return AlertBook()


async def _actuators(
    ha: HAClient, profile_path: Path, start: datetime, end: datetime, zone: ZoneInfo
) -> list[tuple[str, int, int]]:
    loaded = policy.load_profile(profile_path)
    globs = [g for rule in loaded.rules for g in (rule.entities or [])]
    known = [str(s.get("entity_id")) for s in await ha.get_states()]
    guarded = sorted(
        e for e in known if e.split(".", 1)[0] in ACTUATOR_DOMAINS and any(fnmatch.fnmatchcase(e, g) for g in globs)
    )
    if not guarded:
        return []
    summaries = await entity_summaries(ha, guarded, start, end, zone)
    out = []
    for entity, summary in summaries.items():
        if summary.get("kind") == "on_off":
            out.append((entity, int(summary["onSeconds"]), int(summary["turnedOn"])))
    return out


def _tasks(conn: sqlite3.Connection, start: datetime, end: datetime) -> tuple[int, list[str]]:
    outcomes = task_runs.outcomes_between(conn, start, end)
    failed = sorted({task_id for task_id, status in outcomes if status != "ok"})
    return len(outcomes), failed


def _llm(conn: sqlite3.Connection, limits: LimitsReader, day: str) -> list[tuple[str, int, int, int]]:
    out = []
    for folder in llm_usage.folders_on(conn, day):
        used = llm_usage.day_usage(conn, folder, day)
        out.append((folder, used.requests, used.tokens, limits.llm_budget(folder).tokens_per_day))
    return out


def _few(items: list[str]) -> list[str]:
    return items[:MAX_ITEMS] + ([f"and {len(items) - MAX_ITEMS} more"] if len(items) > MAX_ITEMS else [])


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
