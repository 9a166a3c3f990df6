"""Who may decide in the farm's main chat: its members (approvals, Acknowledge, Stop everything, /stop, /resume).

With FARMHOST_TELEGRAM_MAIN_SENDERS set, the listed user ids are the members. Without it, a group or supergroup
is asked: getChatMember. Creator, administrator, member, and restricted with `is_member` are members; left, kicked,
or "user not found" are not. A public supergroup shows its messages, and their buttons, to anyone who opens it: a
press alone says nothing about membership. A private main chat (a one-to-one chat with the bot: a positive chat
id) is not asked: Telegram shows it, and its buttons, to nobody but the user it is with.

Telegram's answer is kept MEMBER_CACHE_SECONDS per chat and user. When Telegram cannot say (the network, a
timeout, an error answer other than "not in the chat") the press counts as a member's, as it did before this check
(it came from the main chat itself), with a warning in the log; the next press asks again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from telegram import Bot, ChatMemberRestricted
from telegram.constants import ChatMemberStatus
from telegram.error import BadRequest, TelegramError

from farmhost.telegram.inbound.update_context import INBOUND_LOGGER

logger = logging.getLogger(INBOUND_LOGGER)

NOT_A_MEMBER: Final = "Only members of the farm's main chat can decide this."

# Long enough that a burst of presses (or a double tap) asks Telegram once, short enough that someone removed from
# the chat loses the right to decide within a minute.
MEMBER_CACHE_SECONDS: Final = 60.0
# Telegram answers getChatMember in well under a second; the updates behind a press wait for it, so give up early.
MEMBER_TIMEOUT: Final = 5.0

_MEMBER_STATUSES: Final = frozenset({ChatMemberStatus.OWNER, ChatMemberStatus.ADMINISTRATOR, ChatMemberStatus.MEMBER})
# Telegram's descriptions (lower case, "Bad Request: " removed) of a user who is not in the chat.
_NOT_IN_CHAT: Final = ("user not found", "member not found", "participant_id_invalid", "user_id_invalid")


class MainChatMembers:
    """Tells whether a user is a member of the main chat, asking Telegram at most once a minute per user."""

    def __init__(
        self,
        bot: Bot,
        senders: frozenset[int],
        *,
        cache_seconds: float = MEMBER_CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Prepare the check; nothing is asked before a press.

        Args:
            bot: The PTB bot that asks getChatMember.
            senders: FARMHOST_TELEGRAM_MAIN_SENDERS (empty: the chat's own members decide).
            cache_seconds: How long Telegram's answer is kept per chat and user.
            clock: Monotonic seconds (time.monotonic).
        """
        self._bot = bot
        self._senders = senders
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._known: dict[tuple[int, int], tuple[bool, float]] = {}  # (chat, user) -> (member, until)

    async def refusal(self, chat_id: int, user_id: int | None) -> str | None:
        """Why `user_id` may not decide in the main chat `chat_id`, or None for a member.

        Args:
            chat_id: The main chat's Telegram id (the chat the press or command came from).
            user_id: Who pressed or wrote (None: a message with no user, which nobody may stand for).

        Returns:
            None for a member (or when Telegram could not say), else NOT_A_MEMBER.
        """
        if user_id is None:
            return NOT_A_MEMBER
        if self._senders:
            return None if user_id in self._senders else NOT_A_MEMBER
        if chat_id > 0:
            return None
        member = await self._member(chat_id, user_id)
        return NOT_A_MEMBER if member is False else None

    async def _member(self, chat_id: int, user_id: int) -> bool | None:
        """Telegram's answer (kept for a while), or None when it could not be asked."""
        now = self._clock()
        known = self._known.get((chat_id, user_id))
        if known is not None and known[1] > now:
            return known[0]
        member = await self._ask(chat_id, user_id)
        if member is not None:
            self._known = {key: value for key, value in self._known.items() if value[1] > now}
            self._known[(chat_id, user_id)] = (member, now + self._cache_seconds)
        return member

    async def _ask(self, chat_id: int, user_id: int) -> bool | None:
        try:
            found = await self._bot.get_chat_member(
                chat_id, user_id, read_timeout=MEMBER_TIMEOUT, connect_timeout=MEMBER_TIMEOUT
            )
        except TelegramError as err:
            if isinstance(err, BadRequest) and any(words in err.message.lower() for words in _NOT_IN_CHAT):
                return False
            logger.warning(
                "telegram: cannot ask whether user %d is in the main chat %d (%s): the press counts as a member's",
                user_id,
                chat_id,
                err,
            )
            return None
        if isinstance(found, ChatMemberRestricted):
            return found.is_member
        return found.status in _MEMBER_STATUSES
