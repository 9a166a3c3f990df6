"""MainChatMembers (telegram/inbound/main_members.py) with the real python-telegram-bot client and the fake Bot API.

Who may decide in the main chat: the FARMHOST_TELEGRAM_MAIN_SENDERS list when it is set, the chat's own user in
a private main chat, else Telegram's getChatMember answer, kept a minute; when Telegram cannot be asked, nobody.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import telegram
from telegram_stub import FakeTelegram

from farmhost.telegram.inbound.main_members import MEMBER_CACHE_SECONDS, NOT_A_MEMBER, MainChatMembers

GROUP = -1001234567890  # a public supergroup: anyone may open it and press its buttons
ANA, EVE = 42, 66


class Clock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def bot(fake_telegram: FakeTelegram) -> AsyncIterator[telegram.Bot]:
    async with telegram.Bot(
        fake_telegram.token, base_url=fake_telegram.base_url, base_file_url=fake_telegram.base_file_url
    ) as client:
        yield client


def _asked(tg: FakeTelegram) -> list[tuple[Any, Any]]:
    return [(c.params["chat_id"], c.params["user_id"]) for c in tg.calls if c.method == "getChatMember"]


@pytest.mark.parametrize(
    ("status", "is_member", "refusal"),
    [
        ("creator", True, None),
        ("administrator", True, None),
        ("member", True, None),
        ("restricted", True, None),
        ("restricted", False, NOT_A_MEMBER),
        ("left", True, NOT_A_MEMBER),
        ("kicked", True, NOT_A_MEMBER),
    ],
)
async def test_a_group_member_is_who_telegram_says_is_in_the_chat(
    fake_telegram: FakeTelegram, bot: telegram.Bot, status: Any, is_member: bool, refusal: str | None
) -> None:
    fake_telegram.set_member(GROUP, ANA, status, is_member=is_member)
    assert await MainChatMembers(bot, frozenset()).refusal(GROUP, ANA) == refusal
    assert _asked(fake_telegram) == [(GROUP, ANA)]


async def test_someone_telegram_does_not_know_in_the_chat_is_not_a_member(
    fake_telegram: FakeTelegram, bot: telegram.Bot
) -> None:
    members = MainChatMembers(bot, frozenset())
    assert await members.refusal(GROUP, EVE) == NOT_A_MEMBER  # 400 "Bad Request: user not found"
    assert await members.refusal(GROUP, None) == NOT_A_MEMBER  # a message with no user: nobody to ask about
    assert _asked(fake_telegram) == [(GROUP, EVE)]


async def test_the_answer_is_kept_a_minute_per_user_and_asked_again_after(
    fake_telegram: FakeTelegram, bot: telegram.Bot
) -> None:
    clock = Clock()
    members = MainChatMembers(bot, frozenset(), clock=clock)
    fake_telegram.set_member(GROUP, ANA)
    burst = [await members.refusal(GROUP, ANA) for _ in range(5)] + [await members.refusal(GROUP, EVE)]
    assert burst == [None] * 5 + [NOT_A_MEMBER]
    assert _asked(fake_telegram) == [(GROUP, ANA), (GROUP, EVE)]

    fake_telegram.set_member(GROUP, ANA, "kicked")  # removed from the chat: still a member until the answer is old
    clock.now += MEMBER_CACHE_SECONDS - 1
    assert await members.refusal(GROUP, ANA) is None
    clock.now += 1
    assert await members.refusal(GROUP, ANA) == NOT_A_MEMBER
    assert _asked(fake_telegram) == [(GROUP, ANA), (GROUP, EVE), (GROUP, ANA)]


@pytest.mark.parametrize(
    "failure",
    [
        {"status": 500},
        {"drop_connection": True},
        {"status": 429, "retry_after": 5},
        {"status": 403, "description": "Forbidden: bot was kicked from the supergroup chat"},
        {"status": 400, "description": "Bad Request: chat not found"},
    ],
)
async def test_when_telegram_cannot_say_the_press_from_the_main_chat_counts_and_the_next_asks_again(
    fake_telegram: FakeTelegram,
    bot: telegram.Bot,
    failure: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # as make_bot sets it: RetryAfter without PTB's deprecation warning
    members = MainChatMembers(bot, frozenset())
    fake_telegram.set_member(GROUP, ANA, "kicked")
    fake_telegram.fail("getChatMember", **failure)
    # As before the check: the press came from the main chat itself; the log says Telegram could not be asked.
    assert await members.refusal(GROUP, ANA) is None
    assert f"cannot ask whether user {ANA} is in the main chat {GROUP}" in caplog.text
    assert await members.refusal(GROUP, ANA) == NOT_A_MEMBER  # the failure was not kept: Telegram's answer is
    assert _asked(fake_telegram) == [(GROUP, ANA), (GROUP, ANA)]


async def test_a_private_main_chat_and_the_senders_list_decide_without_asking(
    fake_telegram: FakeTelegram, bot: telegram.Bot
) -> None:
    private = MainChatMembers(bot, frozenset())  # Telegram shows a private chat's buttons to its one user only
    assert await private.refusal(ANA, ANA) is None
    assert await private.refusal(ANA, EVE) is None
    listed = MainChatMembers(bot, frozenset({EVE}))
    fake_telegram.set_member(GROUP, ANA, "creator")  # a member of the chat, but not on the operator's list
    assert await listed.refusal(GROUP, EVE) is None
    assert await listed.refusal(GROUP, ANA) == NOT_A_MEMBER
    assert await listed.refusal(ANA, ANA) == NOT_A_MEMBER
    assert _asked(fake_telegram) == []
