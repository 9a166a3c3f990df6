"""CommandReplies: the reply to a bot command in a registered chat, from the store, the runtime and the app.

`/help` and `/start` work in every chat; `/status`, `/tasks`, `/stop` and `/resume` only in the main chat
(elsewhere a refusal, and nothing is done), and `/stop` and `/resume` only from its members (main_members.py).
The texts themselves are built in commands.py and stop.py; this gathers what they are built from, and for /stop
and /resume does what they say (emergency_stop.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from farmhost.agents.runtime import AgentRuntime
from farmhost.outbox import stop_messages as stop
from farmhost.store import groups, tasks
from farmhost.store.groups import Group
from farmhost.store.task_runs import last_statuses
from farmhost.telegram.bot import chat_id_of
from farmhost.telegram.inbound import commands
from farmhost.telegram.inbound.routing import Route
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts

logger = logging.getLogger(INBOUND_LOGGER)

StatusSource = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class CommandReply:
    """The reply's text, and its inline keyboard (the Stop everything button after /stop and /resume)."""

    text: str
    reply_markup: dict[str, Any] | None = None


class CommandReplies:
    """Builds command replies; `status` is the app's part of `/status` (None: the store's counts only)."""

    def __init__(self, ports: InboundPorts, runtime: AgentRuntime, status: StatusSource | None) -> None:
        self._ports = ports
        self._runtime = runtime
        self._status = status

    async def reply(self, decision: Route, group: Group, who: str, sender_id: int | None) -> CommandReply:
        """The reply to `decision.command` in `group`; `who` (user id `sender_id`) sent it."""
        ports = self._ports
        command = decision.command
        if command in ("help", "start"):
            return CommandReply(commands.help_text(group, ports.bot.username))
        assert command is not None
        if not group.is_main:
            return CommandReply(commands.refusal(command))
        if command in ("stop", "resume"):
            return await self._emergency(command, group, who, sender_id)
        if command == "status":
            document = await self._status_document()
            return CommandReply(commands.status_text(document, now=ports.clock(), zone=ports.settings.zone))
        rows = tasks.list_tasks(ports.db.conn)
        return CommandReply(commands.tasks_text(rows, last_statuses(ports.db.conn), zone=ports.settings.zone))

    async def _emergency(self, command: str, group: Group, who: str, sender_id: int | None) -> CommandReply:
        """/stop or /resume in the main chat: done when a member sent it, else refused."""
        ports = self._ports
        refusal = await ports.members.refusal(chat_id_of(group.jid), sender_id)
        if refusal is not None:
            logger.warning("telegram: /%s by %s in the main chat refused: %s", command, who, refusal)
            return CommandReply(refusal)
        if ports.stop is None:
            return CommandReply("The emergency stop is not available in this daemon.")
        # The answer carries the Stop everything button (stop again, e.g. after a failure).
        if command == "stop":
            return CommandReply(stop.stop_text(await ports.stop.stop(by=who, via="/stop")), stop.stop_keyboard())
        return CommandReply(stop.resume_text(ports.stop.resume(by=who)), stop.stop_keyboard())

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
