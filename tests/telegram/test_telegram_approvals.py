"""Approving new chats: an unregistered chat that addresses the bot -> Approve/Reject in main -> registered or not."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import register_in_process
from hypothesis import given
from hypothesis import strategies as st
from inbound_support import (
    FIELD_CHAT,
    MAIN_CHAT,
    Host,
    calls,
    new_data_dir,
    prompts,
    running,
    settings_for,
    until,
    wait_calls,
    wait_sent,
)
from telegram_stub import FakeTelegram

from farmhost.groups.registry import unregister
from farmhost.protocol.codes import FOLDER_RE, folder_problem
from farmhost.store.db import Database
from farmhost.telegram.inbound.new_chats import callback_data, folder_for, parse_callback

MAIN = f"telegram:{MAIN_CHAT}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


def group_row(host: Host, jid: str) -> Any:
    rows = host.rows("SELECT * FROM groups WHERE jid = ?", jid)
    return rows[0] if rows else None


def pending(host: Host, jid: str) -> Any:
    rows = host.rows("SELECT * FROM pending_chats WHERE jid = ?", jid)
    return rows[0] if rows else None


async def ask(tg: FakeTelegram, host: Host, chat_id: int, text: str, **kw: Any) -> Any:
    """A message from an unregistered chat; returns the approval message the main chat got."""
    before = len(tg.sent(MAIN_CHAT))
    update = tg.user_message(chat_id, text, **kw)
    await until(lambda: host.offset() == update["update_id"] + 1)
    sent = await wait_sent(tg, before + 1, MAIN_CHAT)
    return sent[-1]


async def test_approval_end_to_end(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True, ipc=True) as host:
        assert host.ipc is not None
        approval = await ask(tg, host, -500, "hello @farm_test_bot", title="Greenhouse Team!", username="bea")
        assert approval.params["reply_markup"] == {
            "inline_keyboard": [
                [
                    {"text": "Approve", "callback_data": "approve:telegram:-500"},
                    {"text": "Reject", "callback_data": "reject:telegram:-500"},
                ]
            ]
        }
        assert '"Greenhouse Team!"' in approval.text and "@bea" in approval.text and "telegram:-500" in approval.text
        [asked] = await wait_sent(tg, 1, -500)
        assert "asked the farm's operator" in (asked.text or "")
        # asking again while pending does not spam anyone
        again = tg.user_message(-500, "/help", title="Greenhouse Team!")
        await until(lambda: host.offset() == again["update_id"] + 1)
        assert host.update(again["update_id"])["detail"] == "already waiting for approval"
        assert group_row(host, "telegram:-500") is None and pending(host, "telegram:-500")["status"] == "pending"

        message_id = approval.result["message_id"]
        tg.callback_query(MAIN_CHAT, message_id, "approve:telegram:-500", user_id=MAIN_CHAT, username="ana")
        [answer] = await wait_calls(tg, "answerCallbackQuery")
        [edit] = await wait_calls(tg, "editMessageText")
        connected = (await wait_sent(tg, 2, -500))[-1]
        group = group_row(host, "telegram:-500")
        decided = pending(host, "telegram:-500")
        # the IPC service serves the new group at once (its own registry check misses commits on its connection)
        assert "greenhouse-team" in [g.folder for g in host.ipc.groups]
        status = root / "ipc" / "greenhouse-team" / "host_status.json"
        await until(status.is_file, what=f"{status} (the heartbeat spawned for a new group writes it, in a thread)")

        later = tg.user_message(-500, "@farm_test_bot how are the tomatoes?", title="Greenhouse Team!")
        await until(lambda: (row := host.update(later["update_id"])) is not None and row["status"] == "done")
        outbox = [r["message_key"] for r in host.outbox()]
    assert (group["folder"], group["name"], group["trigger"], group["requires_trigger"], group["is_main"]) == (
        "greenhouse-team", "Greenhouse Team!", "@farm_test_bot", 1, 0
    )  # fmt: skip
    assert (root / "groups" / "greenhouse-team").is_dir() and (root / "ipc" / "greenhouse-team" / "actions").is_dir()
    assert (decided["status"], decided["folder"], decided["decided_by"]) == ("approved", "greenhouse-team", "@ana")
    assert answer.params["text"] == 'Connected "Greenhouse Team!" as folder greenhouse-team.'
    assert (edit.params["chat_id"], edit.params["message_id"]) == (MAIN_CHAT, message_id)
    assert edit.params["text"].endswith("Approved by @ana: connected as folder greenhouse-team.")
    assert "reply_markup" not in edit.params  # the buttons are gone
    assert "Address me with @farm_test_bot" in (connected.text or "")
    assert len(prompts(root, "greenhouse-team")) == 1
    assert [k.split(":")[0] for k in outbox] == ["approval", "approval-asked", "connected", "reply"]


async def test_reject_registers_nothing_and_a_rejected_chat_is_not_offered_again(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True) as host:
        approval = await ask(tg, host, -600, "@farm_test_bot let me in", title="Neighbours")
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "reject:telegram:-600", user_id=MAIN_CHAT)
        [answer] = await wait_calls(tg, "answerCallbackQuery")
        [edit] = await wait_calls(tg, "editMessageText")
        again = tg.user_message(-600, "@farm_test_bot please?", title="Neighbours")
        await until(lambda: host.offset() == again["update_id"] + 1)
        state = pending(host, "telegram:-600")
        again_row = host.update(again["update_id"])
        outbox_size = len(host.outbox())
        assert group_row(host, "telegram:-600") is None
    assert answer.params["text"] == 'Rejected "Neighbours".' and edit.params["text"].endswith("Rejected by @ana.")
    assert state["status"] == "rejected"
    assert "rejected earlier" in again_row["detail"] and outbox_size == 2  # the offer and its notice only


async def test_only_the_main_chat_and_its_allowed_senders_can_decide(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg, FARMHOST_TELEGRAM_MAIN_SENDERS="42"), deliver=True) as host:
        approval = await ask(tg, host, -700, "hi @farm_test_bot", title="Barn")
        # a button press from another chat (the data is easy to forge) and from a stranger in main
        tg.callback_query(FIELD_CHAT, 1, "approve:telegram:-700")
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "approve:telegram:-700", user_id=99)
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "approve:telegram:-999999")  # unknown chat
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "launch:missiles")
        answers = await wait_calls(tg, "answerCallbackQuery", 4)
        statuses = [r["status"] for r in host.rows("SELECT status FROM telegram_updates ORDER BY update_id")]
        assert group_row(host, "telegram:-700") is None and pending(host, "telegram:-700")["status"] == "pending"
    assert [a.params["text"] for a in answers] == [
        "Only the farm's main chat can approve chats.",
        "Only members of the farm's main chat can decide this.",
        "There is no request from telegram:-999999 (any more).",
        "This button is not used any more.",
    ]
    assert statuses == ["offered", "refused", "refused", "callback", "ignored"]
    assert calls(tg, "editMessageText") == []


async def test_without_a_sender_list_a_press_in_the_private_main_chat_decides_unasked(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram  # the main chat (100) is a private chat: Telegram shows its buttons to nobody else
    async with running(settings_for(root, tg), deliver=True) as host:
        approval = await ask(tg, host, -710, "hi @farm_test_bot", title="Shed")
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "approve:telegram:-710", user_id=MAIN_CHAT)
        [answered] = await wait_calls(tg, "answerCallbackQuery")
        connected = group_row(host, "telegram:-710")
    assert answered.params["text"] == 'Connected "Shed" as folder shed.' and connected is not None
    assert calls(tg, "getChatMember") == []  # a private chat is not asked about


async def test_folders_are_unique_and_private_chats_need_no_trigger(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    register_in_process(root, jid="telegram:300", name="Old chat", folder="ana")
    async with running(settings_for(root, tg), deliver=True) as host:
        first = await ask(tg, host, -801, "/start", title="Field")
        second = await ask(tg, host, -802, "@farm_test_bot", title="GLOBAL")
        third = await ask(tg, host, 77, "hello", chat_type="private", first_name="Ana", username=None)
        for approval, data in ((first, -801), (second, -802), (third, 77)):
            tg.callback_query(MAIN_CHAT, approval.result["message_id"], f"approve:telegram:{data}", user_id=MAIN_CHAT)
        await wait_calls(tg, "answerCallbackQuery", 3)
        rows = [group_row(host, f"telegram:{chat}") for chat in (-801, -802, 77)]
        private = tg.user_message(77, "is it going to rain?", chat_type="private", first_name="Ana", username=None)
        await until(lambda: (row := host.update(private["update_id"])) is not None and row["status"] == "done")
    assert [(r["folder"], r["requires_trigger"]) for r in rows] == [("field-2", 1), ("global-2", 1), ("ana-2", 0)]
    assert len(prompts(root, "ana-2")) == 1


async def test_an_approved_chat_never_gets_the_folder_a_removed_group_left(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    register_in_process(root, jid="telegram:-310", name="Barn", folder="barn")
    (root / "groups" / "barn" / "MEMORY.md").write_text("the old barn chat's private notes\n")
    db = Database.open(root)
    try:
        with db.tx() as conn:
            unregister(conn, "barn")  # what `farmhost group remove barn` does: the files stay
    finally:
        db.close()
    async with running(settings_for(root, tg), deliver=True) as host:
        approval = await ask(tg, host, -311, "hi @farm_test_bot", title="Barn")
        tg.callback_query(MAIN_CHAT, approval.result["message_id"], "approve:telegram:-311", user_id=MAIN_CHAT)
        [answered] = await wait_calls(tg, "answerCallbackQuery")
        row = group_row(host, "telegram:-311")
    assert row["folder"] == "barn-2" and answered.params["text"] == 'Connected "Barn" as folder barn-2.'
    assert not (root / "groups" / "barn-2" / "MEMORY.md").exists()


async def test_adding_the_bot_to_a_group_offers_it(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True):
        member = {"user": {"id": tg.bot_id, "is_bot": True, "first_name": "Farm", "username": tg.username}}
        change = {
            "chat": {"id": -900, "type": "supergroup", "title": "Orchard"},
            "from": {"id": 42, "is_bot": False, "first_name": "Ana", "username": "ana"},
            "date": int(time.time()),
            "old_chat_member": {**member, "status": "left"},
            "new_chat_member": {**member, "status": "member"},
        }
        with tg._cond:  # the fake has no builder for membership changes
            tg._queue_update("my_chat_member", change)
        [approval] = await wait_sent(tg, 1, MAIN_CHAT)
    assert '"Orchard"' in (approval.text or "") and "@ana" in (approval.text or "")


async def test_an_unregistered_chat_that_does_not_address_the_bot_is_ignored(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg)) as host:
        update = tg.user_message(-555, "lunch at noon?", title="Family")
        await until(lambda: host.offset() == update["update_id"] + 1)
        row = host.update(update["update_id"])
        chat = host.rows("SELECT name FROM chats WHERE jid = 'telegram:-555'")
        assert host.outbox() == [] and pending(host, "telegram:-555") is None
        assert host.transcript("telegram:-555") == []
    assert (row["status"], row["detail"]) == ("ignored", "the chat is not registered")
    assert chat[0]["name"] == "Family"


@given(st.text(max_size=200), st.sets(st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True), max_size=20))
def test_a_folder_from_any_title_is_valid_free_and_not_reserved(title: str, taken: set[str]) -> None:
    folder = folder_for(title, lambda name: name.lower() in taken)
    assert FOLDER_RE.fullmatch(folder) and folder_problem(folder) is None and folder not in taken


@given(st.integers(min_value=-(10**16), max_value=10**16), st.sampled_from(["approve", "reject"]))
def test_callback_data_round_trips_within_64_bytes(chat_id: int, choice: str) -> None:
    data = callback_data(choice, f"telegram:{chat_id}")  # type: ignore[arg-type]
    assert len(data.encode()) <= 64 and parse_callback(data) == (choice, f"telegram:{chat_id}")


async def test_strangers_cannot_flood_the_main_chat_with_requests(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    strangers = range(9001, 9031)  # thirty accounts writing to the bot in private
    async with running(settings_for(root, tg), deliver=True) as host:
        for user in strangers:
            last = tg.user_message(user, "hi", user_id=user, chat_type="private", first_name=f"Spam {user}")
        await until(lambda: host.offset() == last["update_id"] + 1, what="every request handled")
        await until(lambda: not [r for r in host.outbox() if r["status"] == "pending"], what="the outbox empty")
        asked = tg.sent(MAIN_CHAT)
        hellos = [call for call in tg.sent() if call.chat_id in strangers]
        waiting = host.rows("SELECT jid FROM pending_chats WHERE status = 'pending'")
        refused = host.update(last["update_id"])
        # once the operator rejects one, the next stranger is asked about again
        tg.callback_query(MAIN_CHAT, asked[0].result["message_id"], "reject:telegram:9001", user_id=MAIN_CHAT)
        await until(lambda: pending(host, "telegram:9001")["status"] == "rejected", what="rejected")
        again = tg.user_message(9031, "hi", user_id=9031, chat_type="private")
        await until(lambda: host.offset() == again["update_id"] + 1)
        await wait_sent(tg, len(asked) + 1, MAIN_CHAT)
    assert len(asked) == 5 and len(hellos) == 5 and len(waiting) == 5
    assert refused["detail"].startswith("not offered: 5 chats already wait for the operator's approval")
