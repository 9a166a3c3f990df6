"""Issue 38 end to end: a voice note in the chat is heard on the farm and handled as the farmer's typed words.

Every part is real but Telegram and the hosted LLM: the daemon (a subprocess), the fake Bot API on 127.0.0.1, the
real faster-whisper model in farmhost's worker process, a spoken note made by espeak-ng and encoded to OGG/Opus as
Telegram sends them, a bubblewrap agent run against the scripted LLM, the real Home Assistant test instance.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import approval_asked, db_rows, press_approval, sent_with, wait_state
from farmhost_testing import FIELD_JID, MAIN_JID, clean_env, running_daemon, wait_for
from ha_fixture import HaInstance
from llm_stub import Reply, ScriptedLLM, ToolCall, pump_state_reply
from telegram_stub import Call, FakeTelegram

from farmhost.store.db import Database
from farmhost.store.transcripts import latest
from farmhost_dev.hf_hub import WHISPER_BASE_REPO, LocalHub
from farmhost_dev.voice import IRRIGATION_NOTE, IRRIGATION_WORDS, free_port, silent_note, spoken_note

pytestmark = pytest.mark.slow  # end to end, many seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = int(FIELD_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"


def _env(ha_env: dict[str, str], tg: FakeTelegram, model: Path | str, **extra: str) -> dict[str, str]:
    return clean_env(
        **ha_env,
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_STT_MODEL=str(model),
        FARMHOST_STT_LANGUAGE="en",
        **extra,
    )


def _llm(llm: ScriptedLLM) -> dict[str, str]:
    return {"FARMHOST_LLM_BASE_URL": llm.base_url, "FARMHOST_LLM_MODEL": "farm-model", "FARMHOST_LLM_API_KEY": "sk"}


def _stored(data_dir: Path, jid: str) -> list[tuple[str, str]]:
    db = Database.open(data_dir)
    try:
        return [(m.direction, m.text) for m in latest(db.conn, [jid])]
    finally:
        db.close()


def _inbox(data_dir: Path, folder: str) -> list[str]:
    return sorted(p.name for p in (data_dir / "groups" / folder / "inbox").iterdir())


def test_a_spoken_request_turns_the_pump_on_and_the_reply_quotes_what_was_heard(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
    whisper_base: Path,
    irrigation_note: bytes,
) -> None:
    assert ha_reset.get_state(PUMP)["state"] == "off"
    llm_stub.script(ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}), pump_state_reply)
    with running_daemon(data_dir, env=_env(ha_env, fake_telegram, whisper_base, **_llm(llm_stub))) as daemon:
        fake_telegram.media_message(MAIN_CHAT, "voice", content=irrigation_note, duration=6, chat_type="private",
                                    title=None)  # fmt: skip
        (reply,) = fake_telegram.wait_sent(1, chat_id=MAIN_CHAT, timeout=90)
        assert "Traceback" not in daemon.log()

    assert ha_reset.get_state(PUMP)["state"] == "on"  # the agent switched it, through farmhost's rules
    heard, answer = str(reply.params["text"]).split("\n\n", 1)
    assert heard.startswith("🎤 ") and all(word in heard.lower() for word in IRRIGATION_WORDS), heard
    assert answer.startswith("Done: the irrigation pump is on.")
    prompt = llm_stub.requests[0].text()
    assert "🎤" in prompt and all(word in prompt.lower() for word in IRRIGATION_WORDS)
    [note] = _inbox(data_dir, "main")  # the audio is kept
    assert note.endswith(".ogg")
    first = _stored(data_dir, MAIN_JID)[0]
    assert first[0] == "in" and first[1].startswith(f"[voice: inbox/{note}] 🎤 ")
    assert "irrigation" in first[1].lower()


def _as_asked(asked: Call, approval: dict[str, Any]) -> str:
    """The approval message and its buttons, without what differs between two requests (ids, expiry minute)."""
    sent = json.dumps({"text": asked.text, "buttons": asked.params["reply_markup"]})
    sent = sent.replace(approval["id"], "<approval>").replace(approval["request_id"], "<request>")
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "<expiry>", sent)


def test_a_spoken_request_asks_for_the_same_approval_as_a_typed_one(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
    whisper_base: Path,
) -> None:
    tg = fake_telegram
    policy = {
        "actionGroups": {"ha_set_entity": ["main", "field"]},
        "rules": [{"entities": [PUMP], "requireApproval": True}],
    }
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))
    pump_on = ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"})
    asked_office = Reply("I asked the farm's office to approve it.")
    llm_stub.script(pump_on, asked_office, pump_on, asked_office)
    with running_daemon(data_dir, env=_env(ha_env, tg, whisper_base, **_llm(llm_stub))) as daemon:
        tg.user_message(FIELD_CHAT, "@Field turn on the pump")
        tg.wait_sent(1, chat_id=FIELD_CHAT, timeout=60)
        (typed,) = db_rows(data_dir, "SELECT * FROM approvals")
        typed_asked = approval_asked(tg, typed["id"])
        press_approval(tg, typed_asked, "n")  # denied: the same call may be asked for again
        wait_for(lambda: sent_with(tg, FIELD_CHAT, f"Approval {typed['id']}"), what="the group told of the denial")

        tg.media_message(FIELD_CHAT, "voice", content=spoken_note("Turn on the pump."), caption="@Field")
        spoken_reply: Call = wait_for(
            lambda: next((c for c in tg.sent(FIELD_CHAT) if (c.text or "").startswith("🎤")), None),
            timeout=90,
            what="the answer to the spoken request",
        )
        (spoken,) = db_rows(data_dir, "SELECT * FROM approvals WHERE id != ?", typed["id"])
        spoken_asked = approval_asked(tg, spoken["id"])
        assert ha_reset.get_state(PUMP)["state"] == "off"  # asked, not done
        press_approval(tg, spoken_asked, "y")
        wait_state(ha_reset, PUMP, "on")
        assert "Traceback" not in daemon.log()

    assert _as_asked(spoken_asked, spoken) == _as_asked(typed_asked, typed)  # the same question, the same buttons
    for column in ("group_folder", "action", "params", "summary", "approvers"):
        assert spoken[column] == typed[column], column
    heard, answer = str(spoken_reply.params["text"]).split("\n\n", 1)
    assert heard.startswith("🎤 ") and "pump" in heard.lower() and answer.startswith(asked_office.text)
    assert "pending_approval" in (llm_stub.requests[3].last_tool_result() or "")


def test_without_an_llm_assist_hears_the_words(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
    whisper_base: Path,
) -> None:
    assert ha_reset.get_state(PUMP)["state"] == "off"
    note = spoken_note("Turn on the irrigation pump.")
    with running_daemon(data_dir, env=_env(ha_env, fake_telegram, whisper_base)) as daemon:
        fake_telegram.media_message(MAIN_CHAT, "voice", content=note, chat_type="private", title=None)
        _notice, reply = fake_telegram.wait_sent(2, chat_id=MAIN_CHAT, timeout=90)
        assert "Traceback" not in daemon.log()
    assert ha_reset.get_state(PUMP)["state"] == "on"  # Assist switched it
    heard, answer = str(reply.params["text"]).split("\n\n", 1)
    assert heard.startswith("🎤 ") and "pump" in heard.lower()
    assert answer.startswith("Turned on")
    audit = [json.loads(line) for line in (data_dir / "farm-state" / "audit.ndjson").read_text().splitlines()]
    [asked] = [a for a in audit if a["action"] == "ha_assist"]
    assert "pump" in asked["params"]["text"].lower() and "[voice" not in asked["params"]["text"]


def test_bad_and_long_notes_get_a_sentence_and_two_groups_are_both_heard(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_env: dict[str, str],
    whisper_base: Path,
) -> None:
    tg = fake_telegram
    llm_stub.script(then=Reply("Noted."))
    env = _env(ha_env, tg, whisper_base, **_llm(llm_stub))
    short = spoken_note("How dry is field one?")
    ten_minutes = silent_note(600)
    with running_daemon(data_dir, env=env) as daemon:
        tg.media_message(MAIN_CHAT, "voice", content=b"OggS this is not audio at all", chat_type="private", title=None)
        (corrupt,) = tg.wait_sent(1, chat_id=MAIN_CHAT, timeout=60)
        tg.media_message(MAIN_CHAT, "voice", content=ten_minutes, duration=600, chat_type="private", title=None)
        (_, too_long) = tg.wait_sent(2, chat_id=MAIN_CHAT, timeout=60)
        # two notes at once from two groups: both heard, both answered
        tg.media_message(MAIN_CHAT, "voice", content=short, chat_type="private", title=None)
        tg.media_message(FIELD_CHAT, "voice", content=short, caption="@Field")
        main_reply = tg.wait_sent(3, chat_id=MAIN_CHAT, timeout=90)[2]
        (field_reply,) = tg.wait_sent(1, chat_id=FIELD_CHAT, timeout=90)
        assert "Traceback" not in daemon.log()

    assert str(corrupt.params["text"]).startswith("🎤 ")
    assert "could not be read as audio" in str(corrupt.params["text"])
    assert str(too_long.params["text"]).startswith("🎤 ") and "120" in str(too_long.params["text"])
    for reply in (main_reply, field_reply):
        heard, answer = str(reply.params["text"]).split("\n\n", 1)
        assert heard.startswith("🎤 ") and "dry" in heard.lower() and answer.startswith("Noted.")
    assert len(llm_stub.requests) == 2  # the refused notes started no run
    assert len(_inbox(data_dir, "main")) == 3  # nothing lost: every note's audio is in the inbox
    stored = wait_for(lambda: _stored(data_dir, MAIN_JID), what="the main chat's transcript")
    refused = [text for direction, text in stored if direction == "in" and "(not transcribed)" in text]
    assert len(refused) == 2


def _wav_at_1_hz() -> bytes:
    """65 KB of PCM that declares one sample a second: 18 hours of sound, gigabytes once resampled to 16 kHz."""
    data = bytes(65_535)
    fmt = struct.pack("<HHIIHH", 1, 1, 1, 2, 2, 16)  # PCM, mono, 1 Hz, 2 bytes/s, block 2, 16 bits
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_note_that_names_other_files_or_lies_about_its_rate_is_refused_and_hears_nothing_else(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_env: dict[str, str],
    whisper_base: Path,
) -> None:
    """A field group's playlist named the main group's note, and the field group heard it: no more.

    The ffconcat playlist names the note relative to the daemon's directory; only the containers a note comes in
    are opened now, each by its demuxer's name, and a frame is counted at its own rate before it is resampled.
    """
    tg = fake_telegram
    llm_stub.script(then=Reply("Noted."))
    with running_daemon(data_dir, env=_env(ha_env, tg, whisper_base, **_llm(llm_stub))) as daemon:
        tg.media_message(MAIN_CHAT, "voice", content=spoken_note("The gate code is seven seven three one."),
                         chat_type="private", title=None)  # fmt: skip
        tg.wait_sent(1, chat_id=MAIN_CHAT, timeout=90)
        [name] = _inbox(data_dir, "main")
        # relative to the daemon's directory (the data dir's parent here; the data dir itself under systemd)
        playlist = f"ffconcat version 1.0\nfile {data_dir.name}/groups/main/inbox/{name}\n".encode()
        tg.media_message(FIELD_CHAT, "voice", content=playlist, caption="@Field")
        tg.media_message(FIELD_CHAT, "voice", content=_wav_at_1_hz(), caption="@Field")
        refused = tg.wait_sent(2, chat_id=FIELD_CHAT, timeout=60)
        assert "Traceback" not in daemon.log()

    for reply in refused:
        text = str(reply.params["text"])
        assert text.startswith("🎤 ") and "not a recording farmhost can read" in text, text
        assert "773" not in text and "seven" not in text.lower()
    assert len(llm_stub.requests) == 1  # the main chat's note only: the field group's notes started no run
    assert all("seven" not in str(row) for row in _stored(data_dir, FIELD_JID))


def test_a_named_model_the_hub_cannot_send_yet_is_a_sentence_and_the_next_note_fetches_it(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_env: dict[str, str],
    whisper_base: Path,
    tmp_path: Path,
) -> None:
    # FARMHOST_STT_MODEL=base on a farm whose line (or mirror) is down: the note is kept and the chat told why.
    tg = fake_telegram
    port = free_port()
    llm_stub.script(then=Reply("Noted."))
    env = _env(ha_env, tg, "base", HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf-home"),
               **_llm(llm_stub))  # fmt: skip
    note = spoken_note("How dry is field one?")
    with running_daemon(data_dir, env=env) as daemon:
        tg.media_message(MAIN_CHAT, "voice", content=note, chat_type="private", title=None)
        (unheard,) = tg.wait_sent(1, chat_id=MAIN_CHAT, timeout=90)
        # The line comes back: the next note fetches the model (once) and is heard, with no restart.
        with LocalHub({WHISPER_BASE_REPO: whisper_base}, port=port) as hub:
            tg.media_message(MAIN_CHAT, "voice", content=note, chat_type="private", title=None)
            heard = tg.wait_sent(2, chat_id=MAIN_CHAT, timeout=120)[1]
        assert "Traceback" not in daemon.log()
        assert "is being downloaded from" in daemon.log()

    text = str(unheard.params["text"])
    assert text.startswith("🎤 The speech-to-text model base is not on the farm computer yet"), text
    assert f"could not be downloaded from http://127.0.0.1:{port}" in text
    words, answer = str(heard.params["text"]).split("\n\n", 1)
    assert "dry" in words.lower() and answer.startswith("Noted.")
    assert sorted(hub.downloads()) == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert len(llm_stub.requests) == 1  # the unheard note started no run
    assert len(_inbox(data_dir, "main")) == 2  # nothing lost: both notes' audio is in the inbox
    stored = [t for d, t in wait_for(lambda: _stored(data_dir, MAIN_JID), what="the transcript") if d == "in"]
    assert "(not transcribed)" in stored[0] and "🎤" in stored[1]
    assert list((data_dir / "models").glob("models--Systran--faster-whisper-base/snapshots/*/model.bin"))


# ---------------------------------------------------------------------- a note is heard beside the polling loop

# The irrigation request read four times: about 22 s of speech in one 30 s window, seconds of hearing on any farm
# computer where answering /stop or /status takes a fraction of one (eight times doubled the windows and the file).
LONG_REPEAT = 4


def _field_rows(data_dir: Path) -> list[dict[str, Any]]:
    return db_rows(data_dir, "SELECT id, text FROM transcript WHERE chat_jid = ? AND direction = 'in' ORDER BY id",
                   FIELD_JID)  # fmt: skip


def _send_long_note(tg: FakeTelegram, data_dir: Path, caption: str | None = None) -> None:
    """A long note in the field group; returns once it is saved in the inbox (its hearing starts then)."""
    note = spoken_note(IRRIGATION_NOTE, repeat=LONG_REPEAT)
    tg.media_message(FIELD_CHAT, "voice", content=note, duration=22, caption=caption)
    inbox = data_dir / "groups" / "field" / "inbox"
    wait_for(lambda: inbox.is_dir() and _inbox(data_dir, "field"), timeout=60, what="the long note saved")


@pytest.fixture
def base_env(ha_env: dict[str, str], fake_telegram: FakeTelegram, whisper_base: Path) -> dict[str, str]:
    """The daemon's environment with Home Assistant, the fake Bot API and faster-whisper-base (no LLM)."""
    return _env(ha_env, fake_telegram, whisper_base)


@pytest.mark.timeout(600)
def test_a_long_note_in_a_field_group_holds_neither_the_main_chats_stop_nor_its_own_chats_order(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, base_env: dict[str, str]
) -> None:
    """Two long notes in a field group held a `/stop` in the main chat for 217 s: the stop no longer waits for them."""
    tg = fake_telegram
    policy = {"actionGroups": {"ha_set_entity": ["main"]}, "rules": [{"entities": [PUMP], "requireApproval": True}]}
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": policy}))
    ha_reset.set_state(PUMP, True)
    wait_state(ha_reset, PUMP, "on")
    with running_daemon(data_dir, env=base_env) as daemon:
        _send_long_note(tg, data_dir)  # no trigger: kept as context
        tg.user_message(FIELD_CHAT, "the gate is shut")  # typed after the note: stored after it
        tg.user_message(MAIN_CHAT, "/stop", user_id=MAIN_CHAT, chat_type="private", title=None)
        wait_for(lambda: sent_with(tg, MAIN_CHAT, "EMERGENCY STOP"), timeout=60, what="the answer to /stop")
        # the stop acted while the field's note was still being heard: none of the field's messages is stored yet
        assert _field_rows(data_dir) == []
        wait_state(ha_reset, PUMP, "off")
        rows = wait_for(lambda: r if len(r := _field_rows(data_dir)) == 2 else None, timeout=300,
                        what="the field's note and text stored")  # fmt: skip
        assert "Traceback" not in daemon.log()

    note, text = rows
    assert note["text"].startswith("[voice: inbox/") and "irrigation" in note["text"].lower()
    assert text["text"] == "the gate is shut"  # after the note, though it arrived while the note was heard
    assert db_rows(data_dir, "SELECT * FROM telegram_deferred") == []


@pytest.mark.timeout(900)
def test_a_kill_9_while_a_note_is_heard_loses_nothing_and_the_restart_answers_it_once(
    data_dir: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM, base_env: dict[str, str]
) -> None:
    tg = fake_telegram
    llm_stub.script(then=Reply("Noted."))
    with running_daemon(data_dir, env={**base_env, **_llm(llm_stub)}) as daemon:
        _send_long_note(tg, data_dir, "@Field")
        tg.user_message(MAIN_CHAT, "/status", user_id=MAIN_CHAT, chat_type="private", title=None)
        wait_for(lambda: tg.sent(MAIN_CHAT), timeout=60, what="the answer to /status")
        assert _field_rows(data_dir) == []  # answered while the note is still being heard
        [kept] = db_rows(data_dir, "SELECT * FROM telegram_deferred")
        assert kept["chat_jid"] == FIELD_JID
        daemon.kill()
        daemon.start(timeout=30)
        answer: Call = wait_for(
            lambda: next((c for c in tg.sent(FIELD_CHAT) if (c.text or "").startswith("🎤")), None),
            timeout=300,
            what="the answer to the note after the restart",
        )
        wait_for(
            lambda: not db_rows(data_dir, "SELECT * FROM telegram_deferred"), what="the note forgotten once handled"
        )
        assert "Traceback" not in daemon.log()

    heard, reply = str(answer.params["text"]).split("\n\n", 1)
    assert "irrigation" in heard.lower() and reply.startswith("Noted.")
    assert [c.text for c in tg.sent(FIELD_CHAT)] == [answer.text]  # answered exactly once
    assert len(llm_stub.requests) == 1
    [row] = _field_rows(data_dir)
    assert row["text"].startswith("[voice: inbox/")
    [update] = db_rows(data_dir, "SELECT * FROM telegram_updates WHERE chat_jid = ?", FIELD_JID)
    assert update["update_id"] == kept["update_id"]
