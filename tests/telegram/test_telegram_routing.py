"""The pure routing decision: triggers, the main chat, the sender allowlist, commands, offers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from farmhost.store.groups import Group
from farmhost.telegram.inbound.routing import Incoming, has_trigger, parse_command, parse_senders, route

BOT, BOT_ID = "farm_test_bot", 123456
AT = datetime(2026, 1, 1, tzinfo=UTC)


def group(*, main: bool = False, trigger: str | None = "@Farm", requires: bool = True) -> Group:
    return Group(jid="telegram:-1", name="Field", folder="field", trigger=trigger, requires_trigger=requires,
                 is_main=main, added_at=AT)  # fmt: skip


def decide(g: Group | None, text: str, *, senders: frozenset[int] = frozenset(), **kw: object) -> str:
    message = Incoming(text=text, sender_id=kw.pop("sender", 42), **kw)  # type: ignore[arg-type]
    return route(g, message, bot_username=BOT, bot_id=BOT_ID, main_senders=senders).action


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("@Farm is the pump on?", "run"),
        ("is the pump on, @farm?", "run"),
        ("hey @FARM!", "run"),
        ("@Farmer John says hi", "store"),
        ("mail me at ana@Farm", "store"),
        ("@Farm_bot hello", "store"),
        (f"@{BOT.upper()} hello", "run"),
        ("no trigger here", "store"),
        ("/help", "command"),
        (f"/status@{BOT}", "command"),
        ("/help@other_bot", "store"),
        ("/unknown @Farm", "run"),
    ],
)
def test_non_main_group_table(text: str, action: str) -> None:
    assert decide(group(), text) == action


def test_reply_to_the_bot_triggers_and_other_rules() -> None:
    assert decide(group(), "yes please", reply_to_bot=True) == "run"
    assert decide(group(requires=False), "anything") == "run"
    assert decide(group(trigger=None), "@Farm hi") == "store"
    assert decide(group(main=True), "anything at all") == "run"
    assert decide(group(), "@Farm hi", sender=BOT_ID) == "ignore"
    assert decide(group(), "@Farm hi", sender_is_bot=True) == "store"
    assert decide(None, "@Farm hi", sender_is_bot=True, chat_type="private") == "ignore"


def test_unregistered_chats_are_offered_only_when_they_address_the_bot() -> None:
    assert decide(None, "hello all") == "ignore"
    assert decide(None, f"hello @{BOT}") == "offer"
    assert decide(None, "/start") == "offer"
    assert decide(None, "/start@other_bot") == "ignore"
    assert decide(None, "thanks", reply_to_bot=True) == "offer"
    assert decide(None, "hi", chat_type="private") == "offer"


def test_parse_helpers() -> None:
    assert parse_command(f"/Status@{BOT}  now ", BOT) == ("status", "now")
    assert parse_command("/status@other", BOT) is None and parse_command("status", BOT) is None
    assert parse_command("/status,", BOT) is None
    assert parse_senders(" 1, 2 3,,") == frozenset({1, 2, 3}) and parse_senders(None) == frozenset()
    with pytest.raises(ValueError, match="'ana' is not a Telegram user id"):
        parse_senders("1,ana")


words = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,15}", fullmatch=True)
fillers = st.lists(st.sampled_from(["the", "pump", "is", "on", "?", "tank", "42", "ok", "\n", "héllo"]), max_size=8)


@given(words, fillers, fillers, st.booleans())
def test_a_trigger_word_anywhere_in_any_case_runs(word: str, before: list[str], after: list[str], at: bool) -> None:
    trigger = f"@{word}" if at else word
    spoken = "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(trigger))
    text = " ".join([*before, spoken, *after])
    assert decide(group(trigger=trigger), text) == "run"


@given(words, st.from_regex(r"[A-Za-z0-9_]{1,5}", fullmatch=True), fillers)
def test_a_trigger_inside_a_longer_word_does_not_run(word: str, glued: str, rest: list[str]) -> None:
    assume(word.lower() != BOT.lower())
    text = " ".join([*rest, f"@{word}{glued}", f"x{word}", f"{glued}@{word}"])
    assert decide(group(trigger=f"@{word}"), text) == "store"


@given(st.text(), st.one_of(st.none(), st.text(max_size=10)), st.booleans(), st.booleans(), st.booleans())
def test_routing_never_fails_and_the_main_chat_never_needs_a_trigger(
    text: str, trigger: str | None, main: bool, requires: bool, private: bool
) -> None:
    g = group(main=main, trigger=trigger, requires=requires)
    action = decide(g, text, chat_type="private" if private else "group")
    assert action in {"run", "store", "command"}
    if main or not requires:
        assert action in {"run", "command"}
    if has_trigger(text, trigger):
        assert action in {"run", "command"}


@given(st.text(), st.integers())
def test_a_sender_outside_the_allowlist_is_never_heard_in_main(text: str, sender: int) -> None:
    assume(sender not in (7, 42))
    assert decide(group(main=True), text, senders=frozenset({7, 42}), sender=sender) == "ignore"
    assert decide(group(main=False), text, senders=frozenset({7, 42}), sender=sender) != "ignore"
