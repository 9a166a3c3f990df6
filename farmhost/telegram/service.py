"""TelegramService: the bot, the long-polling inbound side and the outbox delivery, started and stopped together."""

from __future__ import annotations

import logging
from collections.abc import Callable

import telegram
from telegram.error import TelegramError

from farmhost.agents.runtime import AgentRuntime
from farmhost.config import TelegramSettings
from farmhost.emergency_stop import EmergencyStop
from farmhost.farm.control.approval_desk import ApprovalDesk
from farmhost.farm.state.alert_notifier import AlertNotifier
from farmhost.handling import Change
from farmhost.layout import DataLayout
from farmhost.store.db import Database
from farmhost.telegram.bot import make_bot
from farmhost.telegram.delivery.worker import OutboxDelivery
from farmhost.telegram.inbound.receiver import StatusSource, TelegramInbound
from farmhost.voice.stt import SpeechToText

logger = logging.getLogger(__name__)


class TelegramService:
    """Connects farmhost to one Telegram bot; everything sent goes through the durable outbox."""

    def __init__(
        self,
        *,
        db: Database,
        settings: TelegramSettings,
        layout: DataLayout,
        runtime: AgentRuntime,
        status: StatusSource,
        on_groups_changed: Callable[[], None],
        desk: ApprovalDesk | None = None,
        stop: EmergencyStop | None = None,
        alerts: AlertNotifier | None = None,
        stt: SpeechToText | None = None,
    ) -> None:
        """Build the bot and both sides; nothing talks to Telegram before `start()`.

        Args:
            db: The daemon's database.
            settings: The token, the Bot API root, polling and delivery settings.
            layout: The data directory (workspaces for inbound media, the outbox's file copies).
            runtime: Where triggered chat messages become agent runs.
            status: The app's part of `/status` (version, start time, Home Assistant).
            on_groups_changed: Called when an approved chat was registered, or a group moved to its supergroup's id
                (GroupRegistry.reload: the registry re-reads the table and announces the change to the IPC service).
            desk: Decides the Approve / Deny buttons of farm actions under approval.
            stop: The emergency stop behind /stop, /resume and the Stop everything button.
            alerts: Records the Acknowledge and Snooze 1 h buttons of farm alerts.
            stt: Hears voice notes (None: they are saved to the group's inbox only).
        """
        self.bot: telegram.Bot = make_bot(settings)
        self.delivery = OutboxDelivery(
            db=db, settings=settings, layout=layout, bot=self.bot, on_groups_changed=on_groups_changed
        )
        self.inbound = TelegramInbound(
            db=db,
            settings=settings,
            layout=layout,
            bot=self.bot,
            runtime=runtime,
            wake_outbox=self.delivery.wake,
            status=status,
            on_groups_changed=on_groups_changed,
            desk=desk,
            stop=stop,
            alerts=alerts,
            stt=stt,
        )

    async def start(self) -> None:
        """Start delivering and polling; an unreachable Telegram is retried by both sides, never fatal."""
        try:
            await self.bot.initialize()  # getMe: the bot's name for transcripts and @mentions
            logger.info("telegram: connected as @%s", self.bot.username)
        except TelegramError as err:
            logger.error("telegram: cannot reach the Bot API yet (%s); retrying in the background", err)
        await self.delivery.start()
        await self.inbound.start()

    async def stop(self) -> None:
        """Stop polling first (no new work), then delivery (in-flight sends get a short grace), then the bot."""
        await self.inbound.stop()
        await self.delivery.stop()
        try:
            await self.bot.shutdown()  # a no-op when it never initialised
        except TelegramError as err:
            logger.warning("telegram: shutting the bot down: %s", err)

    def ipc_changed(self, changes: set[Change]) -> None:
        """IPC listener: an agent queued a message or a file, so deliver now rather than at the next rescan."""
        if Change.OUTBOX in changes:
            self.delivery.wake()
