"""CommandReplies: the reply to a bot command in a registered chat, from the store, the runtime and the app.

`/help` and `/start` work in every chat; `/status`, `/tasks`, `/stop` and `/resume` only in the main chat
(elsewhere a refusal, and nothing is done). The texts themselves are built in commands.py and stop.py; this
gathers what they are built from, and for /stop and /resume does what they say (emergency_stop.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from farmhost.agents.runtime import AgentRuntime
from farmhost.outbox import stop_messages as stop
from farmhost.store import groups, tasks
from farmhost.store.groups import Group
from farmhost.store.task_runs import last_statuses
from farmhost.telegram.inbound import commands
from farmhost.telegram.inbound.routing import Route
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts

logger = logging.getLogger(INBOUND_LOGGER)

StatusSource = Callable[[], Awaitable[dict[str, Any]]]


class CommandReplies:
    """Builds command replies; `status` is the app's part of `/status` (None: the store's counts only)."""

    def __init__(self, ports: InboundPorts, runtime: AgentRuntime, status: StatusSource | None) -> None:
        self._ports = ports
        self._runtime = runtime
        self._status = status

    async def reply(self, decision: Route, group: Group, who: str) -> str:
        """The text answering `decision.command` in `group`; `who` sent it (for /stop and /resume)."""
        ports = self._ports
        command = decision.command
        if command in ("help", "start"):
            return commands.help_text(group, ports.bot.username)
        assert command is not None
        if not group.is_main:
            return commands.refusal(command)
        if command in ("stop", "resume"):
            if ports.stop is None:
                return "The emergency stop is not available in this daemon."
            if command == "stop":
                return stop.stop_text(await ports.stop.stop(by=who, via="/stop"))
            return stop.resume_text(ports.stop.resume(by=who))
        if command == "status":
            return commands.status_text(await self._status_document(), now=ports.clock(), zone=ports.settings.zone)
        rows = tasks.list_tasks(ports.db.conn)
        return commands.tasks_text(rows, last_statuses(ports.db.conn), zone=ports.settings.zone)

    async def _status_document(self) -> dict[str, Any]:
        extra: dict[str, Any] | None = None
        if self._status is not None:
            try:
                extra = await self._status()
            except Exception as err:
                logger.exception("telegram: the status source failed")
                extra = {"note": f"part of the status is unavailable ({type(err).__name__})"}
        conn = self._ports.db.conn
        queued = sum(self._runtime.queued(group.folder) for group in groups.list_groups(conn))
        return commands.collect_status(
            conn, running=len(self._runtime.running), queued=queued, extra=extra, paused=self._runtime.paused
        )
