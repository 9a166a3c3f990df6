"""The sites on the broker, as their retained availability topics say: which exist, which are online since when.

Every farmhost keeps `farmhost/<site>/availability` retained (`online`, and `offline` by its last will or when
it stops), so a subscription to `farmhost/+/availability` tells a new connection every site at once. A site is
known once its topic has been seen; an emptied topic (the retained value removed) forgets it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from farmhost.broker import OFFLINE, ONLINE
from farmhost.sites.wire import site_of_availability
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    from farmhost.mqtt.link import Incoming

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteState:
    """What a site's availability topic last said, and when this site heard it."""

    online: bool
    since: datetime


class SiteDirectory:
    """The other sites, from their availability topics."""

    def __init__(
        self, own: str, *, on_online: Callable[[str], None] = lambda site: None, clock: Callable[[], datetime] = now_utc
    ) -> None:
        self.own = own
        self._sites: dict[str, SiteState] = {}
        self._on_online = on_online
        self._clock = clock

    def get(self, site: str) -> SiteState | None:
        """The state of `site`, None when the broker never said it exists."""
        return self._sites.get(site)

    def listing(self) -> str:
        """`greenhouse (online), barn (offline)` or `none`: for answers that name the known sites."""
        parts = [f"{name} ({'online' if s.online else 'offline'})" for name, s in sorted(self._sites.items())]
        return ", ".join(parts) or "none"

    async def on_availability(self, message: Incoming) -> None:
        """A site's availability changed (or the retained value arrived after subscribing)."""
        site = site_of_availability(message.topic)
        if site is None or site == self.own:
            return
        text = message.payload.decode(errors="replace").strip()
        if not text:
            if self._sites.pop(site, None) is not None:
                logger.info("sites: %s is gone from the broker", site)
            return
        if text not in (ONLINE, OFFLINE):
            logger.warning("sites: ignored %r on %s (online or offline expected)", text[:40], message.topic)
            return
        online = text == ONLINE
        before = self._sites.get(site)
        if before is not None and before.online == online:
            return
        self._sites[site] = SiteState(online=online, since=self._clock())
        logger.info("sites: %s is %s", site, text)
        if online:
            self._on_online(site)
