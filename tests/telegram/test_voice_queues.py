"""A voice note is heard beside the polling loop (chat_queues.py): the caps on what waits, and the main chat's /stop.

The real services with the fake Bot API and the real embedded engine on faster-whisper-base. "A note being heard"
is made to last as long as a test needs, whatever the machine's speed: the engine's worker is loaded first and
then stopped (SIGSTOP) while the updates arrive, and continued (SIGCONT) to let the notes be heard.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import inbound_support as inbound
import pytest
from farmhost_testing import register_in_process
from inbound_support import FIELD_CHAT, MAIN_CHAT, Host, running, settings_for, until, wait_sent
from telegram_stub import FakeTelegram
from voice_fixture import voice_settings

from farmhost.telegram.inbound.chat_queues import MAX_PER_CHAT, MAX_WAITING
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER
from farmhost.telegram.inbound.voice_notes import BUSY
from farmhost.voice.embedded import EmbeddedEngine

pytestmark = pytest.mark.slow  # the real Whisper model, loaded once per test

MAIN, FIELD = f"telegram:{MAIN_CHAT}", f"telegram:{FIELD_CHAT}"
OUT_OF_ORDER = "out of its chat's order"
Logs = pytest.LogCaptureFixture
# Long enough for the model's load and a few notes heard on a busy farm computer.
HEARING = 180.0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return inbound.new_data_dir(tmp_path)


@pytest.fixture
async def stt(whisper_base: Path) -> AsyncIterator[EmbeddedEngine]:
    """The embedded engine with its worker started and the model loaded."""
    engine = EmbeddedEngine(voice_settings(model=whisper_base))
    try:
        await engine.load()
        yield engine
    finally:
        await engine.aclose()


@pytest.fixture
def logged(caplog: Logs) -> Logs:
    """What the inbound service logs, from INFO."""
    caplog.set_level(logging.INFO, logger=INBOUND_LOGGER)
    return caplog


@contextmanager
def held(stt: EmbeddedEngine) -> Iterator[None]:
    """The engine's worker stopped: a note handed to it is being heard until the block ends (60 s at most)."""
    pid = stt.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def deferred(host: Host) -> list[int]:
    return [r["update_id"] for r in host.rows("SELECT update_id FROM telegram_deferred ORDER BY update_id")]


def statuses(host: Host, updates: list[dict[str, Any]]) -> list[str | None]:
    return [(row["status"] if (row := host.update(u["update_id"])) is not None else None) for u in updates]


def said_in(host: Host, jid: str) -> list[str]:
    """The chat's incoming transcript texts, in the order they were stored."""
    return [text for direction, _, text in host.transcript(jid) if direction == "in"]


def out_of_order(caplog: Logs) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and OUT_OF_ORDER in r.getMessage()]


async def test_past_the_cap_of_one_chat_an_update_is_handled_at_once_and_nothing_is_lost(
    root: Path, fake_telegram: FakeTelegram, stt: EmbeddedEngine, irrigation_note: bytes, logged: Logs
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True, stt=stt) as host:
        with held(stt):
            note = tg.media_message(FIELD_CHAT, "voice", content=irrigation_note, duration=6, caption="@Field")
            # the note and these wait in the field's queue: MAX_PER_CHAT (20) in all
            rows = [tg.user_message(FIELD_CHAT, f"row {n} is wet") for n in range(1, MAX_PER_CHAT)]
            past = tg.user_message(FIELD_CHAT, "@Field is the gate shut?")
            await until(lambda: host.offset() == past["update_id"] + 1, what="every update taken from Telegram")
            [early] = await wait_sent(tg, 1, FIELD_CHAT)  # the one past the cap is answered while the note waits
            waiting = deferred(host)
            stored_meanwhile = said_in(host, FIELD)
            warnings = out_of_order(logged)
        await until(lambda: not deferred(host), timeout=HEARING, what="the field's queue worked through")
        replies = await wait_sent(tg, 2, FIELD_CHAT, timeout=HEARING)
        done = statuses(host, [note, *rows, past])
        stored = said_in(host, FIELD)

    assert waiting == [u["update_id"] for u in (note, *rows)]  # the 20 that waited were kept in the database
    assert stored_meanwhile == ["@Field is the gate shut?"]  # handled out of its chat's order
    assert early.text.startswith("echo: ") and early.text.endswith("@Field is the gate shut?")
    [warning] = warnings
    assert f"update {past['update_id']} of {FIELD}" in warning
    assert f"{MAX_PER_CHAT} update(s) wait in that chat" in warning
    # nothing lost: the note heard and answered after the early one, the 19 rows after the note, each handled once
    assert done == ["done"] + ["stored"] * (MAX_PER_CHAT - 1) + [
        "done"
    ]  # the two for the agent ran, the rest is context
    assert stored[0] == "@Field is the gate shut?"
    assert stored[1].startswith("[voice: inbox/") and "🎤" in stored[1] and "irrigation" in stored[1].lower()
    assert stored[2:] == [f"row {n} is wet" for n in range(1, MAX_PER_CHAT)]
    assert [r.text for r in replies] == [early.text, replies[1].text]
    assert replies[1].text.startswith("🎤") and "irrigation" in replies[1].text.lower()


async def test_past_the_cap_over_all_chats_a_note_is_kept_unheard_and_its_chat_told_the_farm_is_busy(
    root: Path, fake_telegram: FakeTelegram, stt: EmbeddedEngine, irrigation_note: bytes, logged: Logs
) -> None:
    tg = fake_telegram
    crews = [-301 - n for n in range(6)]
    for n, chat in enumerate(crews, start=1):  # the last one answers every message: a note there is for the agent
        register_in_process(root, jid=f"telegram:{chat}", name=f"Crew {n}", folder=f"crew{n}",
                            requires_trigger=chat != crews[-1])  # fmt: skip
    *queued_chats, busy_chat = [FIELD_CHAT, *crews]
    sizes = [17, 17, 17, 17, 16, 16]  # 100 waiting in all, none of the chats at its own cap of 20
    assert sum(sizes) == MAX_WAITING and max(sizes) < MAX_PER_CHAT and len(sizes) == len(queued_chats)
    async with running(settings_for(root, tg), deliver=True, stt=stt) as host:
        with held(stt):
            notes, texts = [], []
            for chat, size in zip(queued_chats, sizes, strict=True):
                notes.append(tg.media_message(chat, "voice", content=irrigation_note, duration=6))
                texts += [tg.user_message(chat, f"tank {n} of chat {chat} is full") for n in range(1, size)]
            past_text = tg.user_message(FIELD_CHAT, "the gate is shut")  # its chat has room; the farm has none
            busy = tg.media_message(busy_chat, "voice", content=irrigation_note, duration=6)
            await until(lambda: host.offset() == busy["update_id"] + 1, what="every update taken from Telegram")
            [told] = await wait_sent(tg, 1, busy_chat)
            waiting = len(deferred(host))
            early = statuses(host, [past_text, busy])
            field_meanwhile = said_in(host, FIELD)
            warnings = out_of_order(logged)
        await until(lambda: not deferred(host), timeout=HEARING, what="every queue worked through")
        done = statuses(host, [*notes, *texts, past_text, busy])
        heard = {chat: said_in(host, f"telegram:{chat}") for chat in [*queued_chats, busy_chat]}
        busy_sent = [c.text for c in tg.sent(busy_chat)]
        inbox = sorted((root / "groups" / "crew6" / "inbox").iterdir())

    assert waiting == MAX_WAITING
    assert early == ["stored", "stored"]  # both handled at once, before any note was heard
    assert field_meanwhile == ["the gate is shut"]
    assert len(warnings) == 2
    assert f"update {past_text['update_id']} of {FIELD}" in warnings[0]
    assert f"update {busy['update_id']} of telegram:{busy_chat}" in warnings[1]
    assert all(f"{MAX_WAITING} in all" in w for w in warnings)
    # the busy note: saved to the inbox, not transcribed, its chat told so once, and no run
    assert told.text == f"🎤 {BUSY}" and busy_sent == [told.text]
    [row] = heard[busy_chat]
    assert row == f"[voice: inbox/{inbox[0].name} (not transcribed)]" and len(inbox) == 1
    assert inbox[0].read_bytes() == irrigation_note
    # every other note heard, in its chat's order; nothing lost
    assert done == ["stored"] * (len(notes) + len(texts) + 2)
    assert heard[FIELD_CHAT][0] == "the gate is shut"
    for chat, size in zip(queued_chats, sizes, strict=True):
        rows = heard[chat][1:] if chat == FIELD_CHAT else heard[chat]
        assert rows[0].startswith("[voice: inbox/") and "irrigation" in rows[0].lower(), rows[0]
        assert rows[1:] == [f"tank {n} of chat {chat} is full" for n in range(1, size)]


async def test_the_main_chats_stop_overtakes_a_note_of_the_main_chat_which_is_heard_after_it_once(
    root: Path, fake_telegram: FakeTelegram, stt: EmbeddedEngine, irrigation_note: bytes, logged: Logs
) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg)
    async with running(settings, deliver=True, stt=stt, emergency_stop=True) as host:
        with held(stt):
            note = tg.media_message(MAIN_CHAT, "voice", content=irrigation_note, duration=6, title="Farm office")
            stop = tg.user_message(MAIN_CHAT, "/stop", title="Farm office")
            [answer] = await wait_sent(tg, 1, MAIN_CHAT)
            waiting = deferred(host)
            stored_meanwhile = said_in(host, MAIN)
            stop_status = statuses(host, [stop])
        await until(lambda: not deferred(host), timeout=HEARING, what="the note heard")
        await until(lambda: statuses(host, [note]) == ["failed"], what="the note's run met the pause")
        sent = [c.text for c in await wait_sent(tg, 2, MAIN_CHAT)]
        stored = said_in(host, MAIN)
        queued_for_main = [r["body"] for r in host.outbox(MAIN)]
        logged = [r.getMessage() for r in logged.records]

    assert "EMERGENCY STOP" in answer.text
    assert waiting == [note["update_id"]]  # the stop did not wait for the note sent before it
    assert stop_status == ["command"]
    assert stored_meanwhile == ["/stop"]
    overtook = f"telegram: /stop (update {stop['update_id']}) is handled before the 1 update(s) its chat waits for"
    assert overtook in logged
    # the note is heard afterwards, stored once, after the stop
    assert stored[0] == "/stop"
    [heard] = stored[1:]
    assert heard.startswith("[voice: inbox/") and "🎤" in heard and "irrigation" in heard.lower()
    # the run it asked for met the pause: the agent never ran, and the chat was told so once, after the stop
    assert inbound.prompts(root, "main") == []
    assert sent[0] == answer.text and len(sent) == 2
    assert queued_for_main == sent
    assert "Agents are paused (stopped by /stop" in sent[1]
