"""Farm alerts told to the chats with no LLM: first message, repeats, acknowledgement, snooze and resolution line.

The collector (farm/state/collector.py) hands every evaluation's active alerts to `observe`. Each new alert is told once to
the main chat (and to the chats of groups subscribed to its rule, `alert-subscriptions.json`) through the durable
outbox, with Acknowledge and Snooze 1 h buttons (and Stop everything under a critical one). A critical alert not
acknowledged is told again every FARMHOST_ALERT_REPEAT_MINUTES, at most MAX_REPEATS times. An alert that is gone
gets one line, a reply to its first message, once it stayed gone for the flap window; one that returns within it
is the same alert and nothing is sent. A warning due in FARMHOST_QUIET_HOURS waits for their end; a critical one
never waits. Every step is a row of `alert_notices` changed in the transaction that queues its message (outbox
keys `alert:<row>:<n>`), so nothing is told twice across a restart or a kill -9, and a message queued while
Telegram is away goes when it is back (the outbox retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from farmhost.config import NotifySettings, QuietHours
from farmhost.farm.state.alerts import Alert, Rule, Severity
from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.stop_messages import stop_keyboard
from farmhost.store import alert_notices, groups
from farmhost.store.alert_notices import AlertNotice
from farmhost.store.db import Database, now_utc

__all__ = ["AlertNotifier", "NotifySettings", "QuietHours", "keyboard", "parse_callback", "read_subscriptions"]

logger = logging.getLogger(__name__)

# "Sent again ... at most 3 times" (SPEC §1): four messages in all for a critical alert nobody acknowledges.
MAX_REPEATS: Final = 3
# The button says "Snooze 1 h" (SPEC §1): long enough to finish a job in the field, short enough for a frost night.
SNOOZE: Final = timedelta(hours=1)
# The loop looks at least this often even when nothing is due (a clock jump, a row changed by another process).
IDLE_LOOK_SECONDS: Final = 30.0
CALLBACK_PREFIX: Final = "al"
ACK: Final = "ack"
SNOOZE_CHOICE: Final = "snooze"
# The whole callback data, nothing more: a row id of at most 12 digits and one of the two choices.
_CALLBACK_RE: Final = re.compile(rf"^{CALLBACK_PREFIX}:([1-9][0-9]{{0,11}}):({ACK}|{SNOOZE_CHOICE})$")
SUBSCRIPTIONS_FILE: Final = "alert-subscriptions.json"
_RULE_WORDS: Final = {
    Rule.FROST.value: "Frost risk",
    Rule.PROBLEM.value: "Problem",
    Rule.SAFETY.value: "Safety alarm",
    Rule.SOIL_MOISTURE_LOW.value: "Soil moisture low",
    Rule.UNAVAILABLE.value: "No data",
    Rule.VIOLATION.value: "Change undone",
}


def parse_callback(data: str | None) -> tuple[int, str] | None:
    """(notice id, `ack` or `snooze`) of an alert button's data; None for anything else."""
    match = _CALLBACK_RE.fullmatch(data or "")
    return (int(match[1]), match[2]) if match else None


def keyboard(notice_id: int, *, critical: bool) -> dict[str, Any]:
    """Acknowledge and Snooze 1 h; a critical alert gets the Stop everything button as a second row."""
    rows: list[list[dict[str, str]]] = [
        [
            {"text": "Acknowledge", "callback_data": f"{CALLBACK_PREFIX}:{notice_id}:{ACK}"},
            {"text": "Snooze 1 h", "callback_data": f"{CALLBACK_PREFIX}:{notice_id}:{SNOOZE_CHOICE}"},
        ]
    ]
    if critical:
        rows.extend(stop_keyboard()["inline_keyboard"])
    return {"inline_keyboard": rows}


def subject_of(alert: Alert) -> str:
    """What makes two alerts the same: rule and entity; each violation is its own (it is an event, not a state)."""
    if alert.rule is Rule.VIOLATION:
        return f"{alert.rule.value}:{alert.id}"
    return f"{alert.rule.value}:{alert.entity_id}"


def read_subscriptions(path: Path) -> dict[str, frozenset[str]]:
    """`alert-subscriptions.json`: `{"groups": {"<folder>": ["frost", ...] or ["*"]}}` (missing: nobody).

    A file that cannot be read or is malformed subscribes nobody and is logged; the main chat is told anyway.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        logger.warning("alerts: ignoring %s: %s", path, err)
        return {}
    folders = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(folders, dict):
        logger.warning('alerts: ignoring %s: it must be {"groups": {"<folder>": [rules]}}', path)
        return {}
    known = {rule.value for rule in Rule} | {"*"}
    found: dict[str, frozenset[str]] = {}
    for folder, rules in folders.items():
        if not isinstance(rules, list) or not all(isinstance(r, str) and r in known for r in rules):
            logger.warning(
                'alerts: ignoring %s for group %r: rules must be a list of %s or "*"', path, folder, sorted(known)
            )
            continue
        found[str(folder)] = frozenset(rules)
    return found


class AlertNotifier:
    """Tells the chats about farm alerts; one per daemon with Home Assistant configured."""

    def __init__(
        self,
        *,
        db: Database,
        settings: NotifySettings,
        subscriptions_path: Path,
        wake_outbox: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._db = db
        self._settings = settings
        self._subscriptions_path = subscriptions_path
        self._subscriptions: tuple[int, dict[str, frozenset[str]]] = (-1, {})
        self._wake_outbox = wake_outbox
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Tell what is due (steps missed while the daemon was down go now), then keep watching the clock."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="alert-notifier")

    async def stop(self) -> None:
        """Stop watching the clock (everything told so far is in the outbox already)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def observe(self, active: Iterable[Alert], now: datetime) -> None:
        """Bring the notices in line with the alerts active now, and queue what is due at once."""
        # A violation is told once per undone change by `tell_event` (farm/control/effect_rules.py): its alert in the book
        # is for alerts.json and MQTT, never a second message, and its notices do not follow the book.
        current = {subject_of(alert): alert for alert in active if alert.rule is not Rule.VIOLATION}
        with self._db.tx() as conn:
            targets = self._targets(conn)
            known = [n for n in alert_notices.live(conn) if n.rule != Rule.VIOLATION.value]
            seen = {(n.subject, n.chat_jid): n for n in known}
            for notice in known:
                alert = current.get(notice.subject)
                if alert is None:
                    self._gone(conn, notice, now)
                else:
                    self._still(conn, notice, alert, now)
            for subject, alert in current.items():
                for jid, rules in targets.items():
                    if (subject, jid) in seen or not _wants(rules, alert.rule.value):
                        continue
                    alert_notices.add(
                        conn,
                        subject=subject,
                        chat_jid=jid,
                        alert_id=alert.id,
                        rule=alert.rule.value,
                        entity_id=alert.entity_id,
                        severity=alert.severity.value,
                        text=alert.message,
                        since=alert.since,
                        due_at=now,
                        at=now,
                    )
            told = self._due(conn, now)
        if told:
            self._wake_outbox()
        self._wake.set()

    def tell_event(self, conn: sqlite3.Connection, *, key: str, entity_id: str, text: str, at: datetime) -> None:
        """Tell a violation (farm/control/effect_rules.py) as a critical alert, in the caller's transaction, exactly once.

        `key` names the undone change (its context): a second call with it queues nothing. The message is
        `text` with Acknowledge, Snooze 1 h and Stop everything; reminders as for any critical alert; no
        resolution line (the change was undone already). The caller wakes the outbox after its commit.
        """
        subject = f"{Rule.VIOLATION.value}:{key}"
        for jid, rules in self._targets(conn).items():
            if not _wants(rules, Rule.VIOLATION.value) or alert_notices.exists(conn, subject, jid):
                continue
            alert_notices.add(
                conn,
                subject=subject,
                chat_jid=jid,
                alert_id=key,
                rule=Rule.VIOLATION.value,
                entity_id=entity_id,
                severity=Severity.CRITICAL.value,
                text=text,
                since=at,
                due_at=at,
                at=at,
            )
        self._due(conn, at)
        self._wake.set()

    def acknowledge(self, notice_id: int, jid: str | None, who: str) -> str:
        """The Acknowledge button: who is recorded and the repeats stop; returns the answer to the press."""
        with self._db.tx() as conn:
            notice = alert_notices.get(conn, notice_id)
            if notice is None or notice.chat_jid != jid:
                return "This alert is not from this chat."
            if notice.acked_by is not None:
                return f"Already acknowledged by {notice.acked_by}."
            alert_notices.acknowledge(conn, notice_id, by=who, at=self._clock())
        logger.info("alerts: %s acknowledged %s (%s)", who, notice.subject, notice.chat_jid)
        return "Acknowledged: no more reminders of this alert."

    def snooze(self, notice_id: int, jid: str | None, who: str) -> str:
        """The Snooze 1 h button: told again in an hour if it is still active; returns the answer to the press."""
        with self._db.tx() as conn:
            notice = alert_notices.get(conn, notice_id)
            if notice is None or notice.chat_jid != jid:
                return "This alert is not from this chat."
            if notice.acked_by is not None:
                return f"Already acknowledged by {notice.acked_by}."
            if not alert_notices.snooze(conn, notice_id, until=self._clock() + SNOOZE):
                return "This alert is over."
        self._wake.set()
        logger.info("alerts: %s snoozed %s (%s) for 1 h", who, notice.subject, notice.chat_jid)
        return "Snoozed: you will be reminded in 1 h if it is still active."

    # ---- the steps

    def _targets(self, conn: sqlite3.Connection) -> dict[str, frozenset[str] | None]:
        """Chat -> the rules it is told about (None: all, the main chat)."""
        registered = groups.list_groups(conn)
        targets: dict[str, frozenset[str] | None] = {g.jid: None for g in registered if g.is_main}
        by_folder = {g.folder: g.jid for g in registered if not g.is_main}
        for folder, rules in self._read_subscriptions().items():
            jid = by_folder.get(folder)
            if jid is not None:
                targets[jid] = rules
        return targets

    def _read_subscriptions(self) -> dict[str, frozenset[str]]:
        try:
            stamp = self._subscriptions_path.stat().st_mtime_ns
        except OSError:
            return {}
        if stamp != self._subscriptions[0]:
            self._subscriptions = (stamp, read_subscriptions(self._subscriptions_path))
        return self._subscriptions[1]

    def _gone(self, conn: sqlite3.Connection, notice: AlertNotice, now: datetime) -> None:
        if notice.status == "held" or (notice.status == "open" and notice.rule == Rule.VIOLATION.value):
            alert_notices.close(conn, notice.id)  # never told (quiet hours), or an event: no line
        elif notice.status == "open":
            alert_notices.resolving(conn, notice.id, resolved_at=now, due_at=now + self._settings.flap)

    def _still(self, conn: sqlite3.Connection, notice: AlertNotice, alert: Alert, now: datetime) -> None:
        if (notice.alert_id, notice.severity, notice.text) != (alert.id, alert.severity.value, alert.message):
            alert_notices.update(conn, notice.id, alert_id=alert.id, severity=alert.severity.value, text=alert.message)
        critical = alert.severity is Severity.CRITICAL
        if notice.status == "resolving":
            alert_notices.reopen(conn, notice.id, due_at=self._repeat_at(notice, now) if critical else None)
        elif notice.status == "held" and critical:
            alert_notices.postpone(conn, notice.id, due_at=now)  # escalated: critical never waits
        elif (
            notice.status == "open"
            and critical
            and notice.due_at is None
            and (repeat := self._repeat_at(notice, now)) is not None
        ):
            alert_notices.postpone(conn, notice.id, due_at=repeat)  # escalated from a warning

    def _repeat_at(self, notice: AlertNotice, now: datetime) -> datetime | None:
        if notice.acked_by is not None or notice.sends > MAX_REPEATS:
            return None
        return now + self._settings.repeat

    def _due(self, conn: sqlite3.Connection, now: datetime) -> int:
        """Queue every step due now; returns how many messages were queued."""
        queued = 0
        for notice in alert_notices.due(conn, now):
            critical = notice.severity == Severity.CRITICAL.value
            quiet_end = self._settings.quiet.end_after(now, self._settings.zone) if self._settings.quiet else None
            if quiet_end is not None and not critical:
                alert_notices.postpone(conn, notice.id, due_at=quiet_end)
                continue
            if notice.status == "resolving":
                self._enqueue(conn, notice, f"alert:{notice.id}:resolved", self._resolved_text(notice), now)
                alert_notices.close(conn, notice.id)
                queued += 1
                continue
            event = notice.rule == Rule.VIOLATION.value  # nothing to resolve: closed when nothing more is due
            if notice.acked_by is not None:
                if event:
                    alert_notices.close(conn, notice.id)
                else:
                    alert_notices.postpone(conn, notice.id, due_at=None)
                continue
            sends = notice.sends + 1
            text = self._text(notice, sends)
            markup = keyboard(notice.id, critical=critical)
            self._enqueue(conn, notice, f"alert:{notice.id}:{sends}", text, now, markup=markup)
            following = self._repeat_at(replace(notice, sends=sends), now) if critical else None
            alert_notices.told(conn, notice.id, sends=sends, due_at=following)
            if event and following is None:
                alert_notices.close(conn, notice.id)
            queued += 1
        return queued

    def _enqueue(
        self,
        conn: sqlite3.Connection,
        notice: AlertNotice,
        key: str,
        text: str,
        now: datetime,
        *,
        markup: dict[str, Any] | None = None,
    ) -> None:
        reply_to = None if key.endswith(":1") else f"alert:{notice.id}:1"
        with contextlib.suppress(sqlite3.IntegrityError):  # queued already (the row's change is the same tx)
            enqueue_notice(
                conn, key=key, jid=notice.chat_jid, text=text, at=now, reply_markup=markup, reply_to=reply_to
            )

    def _text(self, notice: AlertNotice, sends: int) -> str:
        since = self._when(notice.since)
        what = "CRITICAL" if notice.severity == Severity.CRITICAL.value else "Warning"
        head = (
            f"{what}: {notice.text}"
            if sends == 1
            else f"Reminder ({sends - 1} of {MAX_REPEATS}), {what}: {notice.text}"
        )
        if notice.rule == Rule.VIOLATION.value:
            return head
        return f"{head}. Since {since} ({notice.entity_id})."

    def _resolved_text(self, notice: AlertNotice) -> str:
        words = _RULE_WORDS.get(notice.rule, notice.rule)
        resolved = self._when(notice.resolved_at or self._clock())
        ack = f" Acknowledged by {notice.acked_by}." if notice.acked_by else ""
        return f"Resolved at {resolved}: {words} ({notice.entity_id}) is over.{ack}"

    def _when(self, moment: datetime) -> str:
        """HH:MM in the farm's zone, with the date when it is not today's."""
        local = moment.astimezone(self._settings.zone)
        today = self._clock().astimezone(self._settings.zone).date()
        return local.strftime("%H:%M") if local.date() == today else local.strftime("%d %b %H:%M")

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                now = self._clock()
                with self._db.tx() as conn:
                    told = self._due(conn, now)
                    upcoming = alert_notices.next_due(conn)
                if told:
                    self._wake_outbox()
            except sqlite3.Error as err:  # the database locked by a stuck writer: look again later
                logger.warning("alerts: cannot read alert_notices: %s; trying again in %g s", err, IDLE_LOOK_SECONDS)
                upcoming = None
            wait = IDLE_LOOK_SECONDS
            if upcoming is not None:
                wait = min(wait, max(0.0, (upcoming - self._clock()).total_seconds()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()


def _wants(rules: frozenset[str] | None, rule: str) -> bool:
    """Whether a chat told about `rules` (None: all, the main chat) is told about `rule`."""
    return rules is None or rule in rules or "*" in rules
