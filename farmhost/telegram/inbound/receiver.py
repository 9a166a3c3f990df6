"""TelegramInbound: everything that comes in from Telegram, by long polling; it wires the parts together.

One update at a time (a voice note to hear, and what its chat sends after it, beside the loop: chat_queues.py): it is routed (routing.py), its media fetched into the group's inbox (media.py), and then
everything it produced (the telegram_updates row, the transcript row, the chats row, a pending chat, outbox
entries, a queued run) is committed in ONE transaction together with the new offset (update_id + 1). Only then is
the next getUpdates sent with that offset, which is what confirms the update to Telegram. A crash before the
commit gets the update again; an update id already in telegram_updates is dropped. At least once, never twice.

Triggered messages are stored `queued` and handed to ChatRuns (chat_runs.py), which runs them in the background
and queues the replies. All replies and notices go through the outbox; only chat actions (typing), callback
answers and the edit of an approval message are sent directly. docs/telegram.md has the whole story.

The parts: polling.py (the getUpdates loop), dispatch.py (one update), message_store.py (messages),
chat_queues.py (updates waiting for a voice note of their chat), command_replies.py (commands), membership.py (offers, the bot joining and leaving), buttons.py (buttons),
main_members.py (who may decide in the main chat), update_context.py (what they share).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from telegram import Bot, Update

from farmhost.agents.runtime import AgentRuntime
from farmhost.config import TelegramSettings
from farmhost.emergency_stop import EmergencyStop
from farmhost.errors import ConfigError
from farmhost.farm.control.approval_desk import ApprovalDesk
from farmhost.farm.state.alert_notifier import AlertNotifier
from farmhost.layout import DataLayout
from farmhost.store import telegram_state
from farmhost.store.db import Database, now_utc
from farmhost.telegram.inbound import dispatch
from farmhost.telegram.inbound.chat_queues import ChatQueues
from farmhost.telegram.inbound.chat_runs import TYPING_INTERVAL, ChatRuns
from farmhost.telegram.inbound.command_replies import CommandReplies, StatusSource
from farmhost.telegram.inbound.main_members import MainChatMembers
from farmhost.telegram.inbound.message_store import MessageStore
from farmhost.telegram.inbound.polling import RETRY_DELAYS, Poller
from farmhost.telegram.inbound.routing import parse_senders
from farmhost.telegram.inbound.update_context import InboundPorts
from farmhost.voice.stt import SpeechToText

__all__ = ["UPDATE_RETENTION", "StatusSource", "TelegramInbound"]

# Processed updates are kept this long (Telegram never redelivers a confirmed one; the rows only serve diagnosis).
UPDATE_RETENTION: Final = timedelta(days=30)


class TelegramInbound:
    """Long-polls Telegram and turns every update into stored messages, agent runs, commands and approvals."""

    def __init__(
        self,
        *,
        db: Database,
        settings: TelegramSettings,
        layout: DataLayout,
        bot: Bot,
        runtime: AgentRuntime,
        wake_outbox: Callable[[], None],
        status: StatusSource | None,
        on_groups_changed: Callable[[], None] | None = None,
        desk: ApprovalDesk | None = None,
        stop: EmergencyStop | None = None,
        alerts: AlertNotifier | None = None,
        stt: SpeechToText | None = None,
        clock: Callable[[], datetime] = now_utc,
        typing_interval: float = TYPING_INTERVAL,
        retry_delays: tuple[float, float] = RETRY_DELAYS,
    ) -> None:
        """Prepare the service; nothing runs before `start()`.

        Args:
            db: The daemon's database (used from the event loop's thread).
            settings: Poll timeout, main-chat senders, media cap, time zone.
            layout: The data directory (group workspaces, for the inbox and new groups).
            bot: The PTB bot from `make_bot`; its owner shuts it down (it is initialised here if it is not yet).
            runtime: Where triggered messages become agent runs.
            wake_outbox: Called after anything was queued in the outbox (OutboxDelivery.wake).
            status: The app's part of `/status` (Home Assistant, version...); None shows the store's counts only.
            on_groups_changed: Called after an approval registered a group (GroupRegistry.reload: a commit on the
                daemon's own connection is announced by whoever made it, not by the watch for other processes').
            desk: Decides the farm-action approval buttons (None: they answer "not used any more").
            stop: The emergency stop behind /stop, /resume and the Stop everything button (None: unavailable).
            alerts: Records the Acknowledge and Snooze 1 h buttons of farm alerts (None: unavailable).
            stt: Hears voice notes before they are routed (None: they are saved to the inbox only).
            clock: The current time (aware).
            typing_interval: Seconds between two typing indicators while a run goes on.
            retry_delays: The first and the longest wait after a failed poll.

        Raises:
            ConfigError: FARMHOST_TELEGRAM_MAIN_SENDERS is not a list of user ids.
        """
        try:
            main_senders = parse_senders(settings.main_senders)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._ports = InboundPorts(
            db=db,
            settings=settings,
            layout=layout,
            bot=bot,
            clock=clock,
            main_senders=main_senders,
            members=MainChatMembers(bot, main_senders),
            wake_outbox=wake_outbox,
            on_groups_changed=on_groups_changed,
            desk=desk,
            stop=stop,
            alerts=alerts,
            stt=stt,
        )
        self._runs = ChatRuns(
            db=db,
            settings=settings,
            bot=bot,
            runtime=runtime,
            wake_outbox=wake_outbox,
            clock=clock,
            typing_interval=typing_interval,
        )
        self._messages = MessageStore(self._ports, self._runs, CommandReplies(self._ports, runtime, status))
        self._queues = ChatQueues(self._ports, self._handle, retry_delays=retry_delays)
        self._poller = Poller(self._ports, self._handle, self._queues, retry_delays=retry_delays)
        self._poll_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Resume the runs a restart interrupted and start polling (in the background; never waits for Telegram)."""
        if self._poll_task is not None:
            return
        self._poller.stopped_reason = None
        with self._ports.db.tx() as conn:
            telegram_state.prune_updates(conn, older_than=self._ports.clock() - UPDATE_RETENTION)
        self._runs.resume()
        self._poll_task = asyncio.create_task(self._poller.run(), name="telegram:poll")

    async def stop(self) -> None:
        """Stop polling at once (a waiting long poll is cancelled) and stop following runs.

        Runs already submitted go on in the runtime until it stops; their rows stay `queued`, so an outcome that
        arrives after this is not recorded and the next start submits the message again.
        """
        if self._poll_task is not None:
            self._poll_task.cancel()
            await asyncio.gather(self._poll_task, return_exceptions=True)
            self._poll_task = None
        await self._queues.stop()
        await self._runs.stop()

    @property
    def polling(self) -> bool:
        """Whether the polling loop is running (False after `stop()` or a fatal error, see `stopped_reason`)."""
        return self._poll_task is not None and not self._poll_task.done()

    @property
    def stopped_reason(self) -> str | None:
        """Why polling ended by itself (a refused token, a bug); None until then (reset by `start()`)."""
        return self._poller.stopped_reason

    async def _handle(self, update: Update, busy: bool) -> None:
        await dispatch.handle(self._ports, self._messages, update, busy=busy)
