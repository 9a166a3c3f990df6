"""InboundPorts: what the handlers of one Telegram update reach, and the steps they share.

The database, the bot, the clock and the callbacks into the rest of the daemon, plus the three things every
handler does: record an update together with its work and the new offset (`finish`), mark a chat as seen
(`seen_chat`) and answer a button press (`answer`).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from telegram import Bot, CallbackQuery, Chat
from telegram.error import TelegramError

from farmhost.config import TelegramSettings
from farmhost.emergency_stop import EmergencyStop
from farmhost.farm.control.approval_desk import ApprovalDesk
from farmhost.farm.state.alert_notifier import AlertNotifier
from farmhost.layout import DataLayout
from farmhost.outbox.text import chat_name
from farmhost.store import chats, telegram_state
from farmhost.store.db import Database
from farmhost.store.telegram_state import UpdateStatus
from farmhost.telegram.bot import jid_of
from farmhost.voice.stt import SpeechToText

if TYPE_CHECKING:
    from farmhost.telegram.inbound.main_members import MainChatMembers

# One logger for the whole inbound side, split over several modules: its name is what operators filter on.
INBOUND_LOGGER: Final = "farmhost.telegram.inbound.receiver"

logger = logging.getLogger(INBOUND_LOGGER)

Work = Callable[[sqlite3.Connection], None]


def retry_delay(delays: tuple[float, float], failures: int) -> float:
    """The wait before the next try after `failures` failed ones: `delays[0]` doubling, at most `delays[1]`."""
    first, cap = delays
    return min(cap, first * 2.0 ** min(failures, 16))


@dataclass(frozen=True)
class InboundPorts:
    """The daemon's side of the inbound handlers (see TelegramInbound for what each one is)."""

    db: Database
    settings: TelegramSettings
    layout: DataLayout
    bot: Bot
    clock: Callable[[], datetime]
    main_senders: frozenset[int]
    members: MainChatMembers  # who may decide in the main chat (approvals, alerts, the emergency stop)
    wake_outbox: Callable[[], None]
    on_groups_changed: Callable[[], None] | None
    desk: ApprovalDesk | None = None  # decides the farm-action approval buttons
    stop: EmergencyStop | None = None  # /stop, /resume and the Stop everything button
    alerts: AlertNotifier | None = None  # the Acknowledge and Snooze 1 h buttons of farm alerts
    stt: SpeechToText | None = None  # hears voice notes (None: they stay files in the inbox)

    def finish(
        self,
        update_id: int,
        jid: str | None,
        status: UpdateStatus,
        detail: str | None,
        work: Work | None = None,
    ) -> None:
        """Record the update, do `work`, and move the offset past it: one transaction."""
        with self.db.tx() as conn:
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=jid, status=status, detail=detail, at=self.clock()
            )
            if work is not None:
                work(conn)
            telegram_state.advance_offset(conn, update_id)

    def seen_chat(self, chat: Chat) -> Work:
        """The work that records `chat` (its name, last seen) in the chats table."""

        def work(conn: sqlite3.Connection) -> None:
            chats.upsert_chat(conn, jid=jid_of(chat.id), name=chat_name(chat), channel="telegram", seen_at=self.clock())

        return work

    async def answer(self, query: CallbackQuery, text: str) -> None:
        """Answer a button press (the little toast in the client); a failure is only logged."""
        try:
            await self.bot.answer_callback_query(query.id, text=text[:200])
        except TelegramError as err:
            logger.warning("telegram: cannot answer a button press: %s", err)
