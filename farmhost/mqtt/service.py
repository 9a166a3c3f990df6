"""Everything farmhost does over MQTT, started and stopped as one: the link, the HA device, the other sites.

Off unless FARMHOST_MQTT_URL is set. The link connects in the background and retries, so a broker that is
down never holds up the daemon's start or the IPC engine (docs/mqtt.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from farmhost.broker import OFFLINE
from farmhost.mqtt.device import HaDevice
from farmhost.mqtt.discovery import Topics
from farmhost.mqtt.link import MqttLink
from farmhost.sites.server import SiteServer

if TYPE_CHECKING:
    from farmhost.agents.runtime import AgentRuntime
    from farmhost.config import SiteSettings
    from farmhost.farm.audit import AuditLog
    from farmhost.farm.state.collector import StateCollector
    from farmhost.ipc.router import Router
    from farmhost.sites.caller import SiteCaller
    from farmhost.store.db import Database
    from farmhost.store.groups import Group

logger = logging.getLogger(__name__)


class MqttService:
    """The broker link and what uses it."""

    def __init__(
        self,
        *,
        settings: SiteSettings,
        db: Database,
        runtime: AgentRuntime,
        alerts: StateCollector | None,
        caller: SiteCaller,
        router: Router,
        audit: AuditLog,
        main_group: Callable[[], Group | None],
    ) -> None:
        """The link to `settings.broker` (MQTT must be on: FARMHOST_MQTT_URL set) and what uses it.

        Raises:
            ValueError: `settings` has no broker.
        """
        broker, site = settings.broker, settings.name
        if broker is None:
            raise ValueError("MQTT is off (FARMHOST_MQTT_URL is not set)")
        topics = Topics(site)
        self.link = MqttLink(
            broker,
            client_id=topics.node,
            will_topic=topics.availability,
            will_payload=OFFLINE,
            on_connect=self._connected,
        )
        self.device = HaDevice(link=self.link, topics=topics, db=db, runtime=runtime, alerts=alerts, zone=settings.zone)
        self.caller = caller
        caller.attach(self.link)
        self.server = SiteServer(
            site=site, trusted=settings.trusted, link=self.link, router=router, audit=audit, main_group=main_group
        )
        self._site = site

    async def start(self) -> None:
        """Connect (in the background), publish the device, serve and send calls."""
        await self.link.start()
        await self.device.start()
        await self.caller.start()
        logger.info("mqtt: site %s on %s", self._site, self.link.broker.shown)

    async def stop(self) -> None:
        """Stop serving and sending, say `offline` and disconnect."""
        await self.caller.stop()
        await self.server.stop()
        await self.device.stop()
        await self.link.stop(goodbye=self.device.goodbye)

    def _connected(self) -> None:
        self.device.announce()
        self.caller.connected()
