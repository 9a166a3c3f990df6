"""farmhost as a device in Home Assistant: its discovery, its state every few seconds, its alerts, its switch.

On each connection and whenever Home Assistant announces itself (`homeassistant/status` = `online`) the
discovery document is published again, then `online` and the state. The state (agent runs, last task run,
outbox, approvals, LLM use today, a heartbeat, agents paused) is read from the database and the runtime every
STATE_SECONDS. A new farm alert is one event. The `Agents paused` switch is the only command: it is taken
only from this site's command topic (the broker's ACL says who may publish there), a retained command is
ignored (it would act again at every reconnect), `OFF` never lifts the emergency stop's pause (only `/resume` in
the main chat does), and pausing is idempotent and kept in the database, so a command redelivered by QoS 1 or a
restart changes nothing twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any, Final

from farmhost.agents.pause import StopHeld, set_paused
from farmhost.background import cancel_and_wait, every
from farmhost.broker import OFFLINE, ONLINE
from farmhost.mqtt.discovery import HA_STATUS, OFF, ON, Topics, discovery_config
from farmhost.mqtt.link import Incoming, MqttLink
from farmhost.store import approvals, host_state, llm_usage, outbox, task_runs
from farmhost.store.db import Database, iso, now_utc

if TYPE_CHECKING:
    from farmhost.agents.runtime import AgentRuntime
    from farmhost.farm.state.collector import StateCollector

logger = logging.getLogger(__name__)

STATE_SECONDS: Final = 10.0
# Of a command that is not acted on, the log shows this many characters: any account the broker lets write the
# command topic chooses the payload, and a retained one comes back at every connection.
COMMAND_SHOWN: Final = 40
RUNS_KEY: Final = "agent_runs:"  # + the farm's date


def count_run(db: Database, zone: tzinfo, at: datetime) -> None:
    """Count one agent run on the farm's date (the `Agent runs today` sensor)."""
    key = RUNS_KEY + at.astimezone(zone).date().isoformat()
    with db.tx(durable=False) as conn:
        host_state.increment(conn, key)
        host_state.forget_older(conn, RUNS_KEY, key)


class HaDevice:
    """Publishes this site as a Home Assistant device over `link` and takes its commands."""

    def __init__(
        self,
        *,
        link: MqttLink,
        topics: Topics,
        db: Database,
        runtime: AgentRuntime,
        alerts: StateCollector | None,
        zone: tzinfo,
        clock: Callable[[], datetime] = now_utc,
        interval: float = STATE_SECONDS,
    ) -> None:
        self._link = link
        self._topics = topics
        self._db = db
        self._runtime = runtime
        self._alerts = alerts
        self._zone = zone
        self._clock = clock
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._seen_alerts: set[str] | None = None  # None until the first look: alerts active at start are not new
        link.subscribe(HA_STATUS, self._ha_status)
        link.subscribe(topics.pause_command, self._pause_command)

    def announce(self) -> None:
        """Discovery, `online` and the state (at every connection, and when HA comes online)."""
        self._link.publish_retained(self._topics.config, json.dumps(discovery_config(self._topics)))
        self._link.publish_retained(self._topics.availability, ONLINE)
        self.publish_state()

    def publish_state(self) -> None:
        """The state JSON, now."""
        self._link.publish_retained(self._topics.state, json.dumps(self.state()))

    def state(self) -> dict[str, Any]:
        """What every sensor reads (`value_json.<key>`)."""
        now = self._clock()
        today = now.astimezone(self._zone).date().isoformat()
        with self._db.tx(durable=False) as conn:
            last = task_runs.latest_run(conn)
            boxes = outbox.count_by_status(conn)
            pending_approvals = approvals.count_pending(conn)
            llm = llm_usage.day_totals(conn, today)
            runs_today = int(host_state.get(conn, RUNS_KEY + today) or 0)
        return {
            "runs_running": len(self._runtime.running),
            "runs_today": runs_today,
            "last_task_status": last.status if last else "none",
            "last_task_at": iso(last.finished_at or last.claimed_at) if last else None,
            "outbox_pending": boxes.get("pending", 0),
            "outbox_failed": boxes.get("failed", 0),
            "approvals_pending": pending_approvals,
            "llm_requests_today": llm.requests,
            "llm_tokens_today": llm.tokens,
            "heartbeat": now.isoformat(timespec="seconds"),
            "agents_paused": ON if self._runtime.paused is not None else OFF,
        }

    async def start(self) -> None:
        """Publish the state and look for new alerts every `interval` seconds, in the background."""
        self._task = asyncio.create_task(every(self._interval, self._tick, first_now=True), name="mqtt:device")

    async def stop(self) -> None:
        """Stop publishing (the link says `offline` when it closes)."""
        await cancel_and_wait(self._task)
        self._task = None

    @property
    def goodbye(self) -> tuple[str, str]:
        """What the link publishes when farmhost stops cleanly."""
        return self._topics.availability, OFFLINE

    def _tick(self) -> None:
        self.publish_state()
        self._new_alerts()

    def _new_alerts(self) -> None:
        if self._alerts is None:
            return
        active = self._alerts.active_alerts()
        if self._seen_alerts is None:
            self._seen_alerts = {alert_id for alert_id, _, _ in active}
            return
        for alert_id, rule, message in active:
            if alert_id not in self._seen_alerts:
                self._seen_alerts.add(alert_id)
                self._link.publish_event(
                    self._topics.alerts, json.dumps({"event_type": rule, "id": alert_id, "message": message})
                )

    async def _ha_status(self, message: Incoming) -> None:
        if message.payload.decode(errors="replace").strip() == ONLINE:
            logger.info("mqtt: Home Assistant announced itself; discovery published again")
            self.announce()

    async def _pause_command(self, message: Incoming) -> None:
        text = message.payload.decode(errors="replace").strip()
        command = text.upper()
        shown = text[:COMMAND_SHOWN] + ("..." if len(text) > COMMAND_SHOWN else "")
        if message.retain:
            logger.warning("mqtt: ignored a retained command %r on %s (commands act once)", shown, message.topic)
            return
        if command not in (ON, OFF):
            logger.warning("mqtt: ignored %r on %s: the switch takes ON or OFF", shown, message.topic)
            return
        try:
            changed = set_paused(self._db, self._runtime, command == ON, by="Home Assistant (MQTT)", at=self._clock())
        except StopHeld as held:
            logger.warning("mqtt: the switch did not resume them: %s", held)
            self.publish_state()  # the switch in Home Assistant goes back to on
            return
        logger.info("mqtt: agents %s%s", "paused" if command == ON else "resumed", "" if changed else " (already)")
        self.publish_state()
