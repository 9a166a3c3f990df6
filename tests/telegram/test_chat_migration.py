"""A group upgraded to a supergroup (a new chat id from Telegram): the registration and what hangs on it follow."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from inbound_support import FIELD_CHAT, MAIN_CHAT, new_data_dir, prompts, running, settings_for, until, wait_sent
from telegram_stub import FakeTelegram

from farmhost.outbox.notices import enqueue_notice
from farmhost.store import groups
from farmhost.store.db import Database

FIELD_SUPERGROUP, MAIN_SUPERGROUP = -1001200, -1001100


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


async def test_a_field_group_that_becomes_a_supergroup_keeps_its_folder_and_context(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    tg.user_message(FIELD_CHAT, "the beans in row 3 look dry")
    to, back = tg.migrate(FIELD_CHAT, FIELD_SUPERGROUP)
    async with running(settings_for(root, tg), deliver=True) as host:
        ask = tg.user_message(FIELD_SUPERGROUP, "@field what do the beans need?", chat_type="supergroup")
        [reply] = await wait_sent(tg, 1, FIELD_SUPERGROUP)
        await until(lambda: (row := host.update(ask["update_id"])) is not None and row["status"] == "done")
        field = groups.get_group(host.db.conn, "field")
        offered = tg.sent(MAIN_CHAT)
        pending = host.rows("SELECT * FROM pending_chats")
        notices = [(row := host.update(u["update_id"])) and row["status"] for u in (to, back)]
    [run] = prompts(root, "field")
    assert notices == ["stored", "ignored"]  # the first notice moved the group; the second found it moved
    assert field is not None and field.jid == f"telegram:{FIELD_SUPERGROUP}"
    assert "the beans in row 3 look dry" in run["prompt"]  # what was said before the upgrade is still context
    assert run["chatJid"] == f"telegram:{FIELD_SUPERGROUP}"
    assert (reply.text or "").startswith("echo: ")
    assert offered == [] and pending == []  # not a stranger asking to be connected


async def test_the_main_chat_that_becomes_a_supergroup_stays_main_and_gets_its_waiting_messages(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    db = Database.open(root)
    with db.tx() as conn:  # a farm alert waiting to be sent when Telegram is reached
        enqueue_notice(conn, key="alert:frost", jid=f"telegram:{MAIN_CHAT}", text="Frost risk", at=datetime.now(UTC))
    db.close()
    tg.migrate(MAIN_CHAT, MAIN_SUPERGROUP, from_first=True)
    async with running(settings_for(root, tg), deliver=True) as host:
        await until(lambda: groups.main_group(host.db.conn).jid == f"telegram:{MAIN_SUPERGROUP}", what="moved")
        tg.user_message(MAIN_SUPERGROUP, "/status", chat_type="supergroup")
        alert, status = await wait_sent(tg, 2, MAIN_SUPERGROUP)
        menus = await until(
            lambda: [c.params for c in tg.calls if c.method == "setMyCommands" and "scope" in c.params][1:],
            what="the main menu in the supergroup",
        )
    assert alert.text == "Frost risk"
    assert (status.text or "").startswith("Farm status")  # answered as the main chat, not refused or offered
    assert menus[-1]["scope"] == {"type": "chat", "chat_id": MAIN_SUPERGROUP}
