"""A farm with no LLM still answers: a Telegram message goes to Home Assistant's Assist through `ha_assist`.

Every part is real: the daemon (a subprocess), long polling against a Telegram stand-in on 127.0.0.1, the IPC
request of the group, the real Home Assistant test instance with Assist, the outbox. No LLM anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from farmhost_testing import FIELD_JID, MAIN_JID, clean_env, running_daemon
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

from farmhost.store import chat_notices
from farmhost.store.db import Database
from farmhost.store.transcripts import latest

pytestmark = pytest.mark.slow  # end to end, several seconds

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = int(FIELD_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
NOTICE_START = "Answers in this chat come from Home Assistant's own assistant (Assist), because no LLM is configured."


def _env(ha_env: dict[str, str], fake_telegram: FakeTelegram) -> dict[str, str]:
    return clean_env(
        **ha_env,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
    )


def _texts(fake_telegram: FakeTelegram, chat_id: int) -> list[str]:
    return [str(call.params["text"]) for call in fake_telegram.sent(chat_id)]


def test_without_an_llm_assist_answers_the_chat_and_switches_the_pump(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    assert ha_reset.get_state(PUMP)["state"] == "off"
    with running_daemon(data_dir, env=_env(ha_env, fake_telegram)) as daemon:
        fake_telegram.user_message(MAIN_CHAT, "turn on the irrigation pump", chat_type="private", title=None)
        notice, reply = fake_telegram.wait_sent(2, chat_id=MAIN_CHAT, timeout=30)
        assert ha_reset.get_state(PUMP)["state"] == "on"  # Assist switched it, through farmhost's policy
        fake_telegram.user_message(MAIN_CHAT, "is the barn light on", chat_type="private", title=None)
        fake_telegram.wait_sent(3, chat_id=MAIN_CHAT, timeout=30)
        assert "Traceback" not in daemon.log()

    assert str(notice.params["text"]).startswith(NOTICE_START)
    assert "An LLM would add" in str(notice.params["text"]) and "FARMHOST_LLM_BASE_URL" in str(notice.params["text"])
    assert str(reply.params["text"]).startswith("Turned on the switch\n\nSeen in Home Assistant:\n")  # a receipt
    assert _texts(fake_telegram, MAIN_CHAT)[2] == "No, off"  # the notice came once

    # the notice is remembered across a restart: the next answer comes alone
    with running_daemon(data_dir, env=_env(ha_env, fake_telegram)):
        fake_telegram.user_message(MAIN_CHAT, "what is the soil moisture of field 1", chat_type="private", title=None)
        fake_telegram.wait_sent(4, chat_id=MAIN_CHAT, timeout=30)
    assert _texts(fake_telegram, MAIN_CHAT)[3:] == ["Soil moisture of field 1 is 45.0 %"]

    audit = [json.loads(line) for line in (data_dir / "farm-state" / "audit.ndjson").read_text().splitlines()]
    assert [(a["group"], a["action"], a["status"], a["params"]["text"]) for a in audit] == [
        ("main", "ha_assist", "success", "turn on the irrigation pump"),
        ("main", "ha_assist", "success", "is the barn light on"),
        ("main", "ha_assist", "success", "what is the soil moisture of field 1"),
    ]
    db = Database.open(data_dir)
    try:
        stored = [(m.direction, m.text) for m in latest(db.conn, [MAIN_JID])]
        assert chat_notices.given(db.conn, MAIN_JID) == ["assist-fallback"]
    finally:
        db.close()
    assert ("in", "turn on the irrigation pump") in stored
    assert any(d == "out" and t.startswith("Turned on the switch\n\nSeen in Home Assistant:") for d, t in stored)


def test_a_group_without_permission_is_refused_by_the_same_policy(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    with running_daemon(data_dir, env=_env(ha_env, fake_telegram)):
        fake_telegram.user_message(FIELD_CHAT, "@field turn on the irrigation pump", title="Field crew")
        (refusal,) = fake_telegram.wait_sent(1, chat_id=FIELD_CHAT, timeout=30)
        assert ha_reset.get_state(PUMP)["state"] == "off"

        # the operator opens ha_assist to the field group in the farm profile: the same message now works
        (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"actionGroups": {"ha_assist": ["field"]}}}))
        fake_telegram.user_message(FIELD_CHAT, "@field turn on the irrigation pump", title="Field crew")
        notice, done = fake_telegram.wait_sent(3, chat_id=FIELD_CHAT, timeout=30)[1:]
    text = str(refusal.params["text"])
    assert text.startswith("I couldn't finish that: no LLM is configured"), text
    assert "Assist could not answer either: ha_assist is only allowed from the main group (unauthorized)" in text
    assert str(notice.params["text"]).startswith(NOTICE_START)
    assert str(done.params["text"]).startswith("Turned on the switch\n\nSeen in Home Assistant:\n")
    assert ha_reset.get_state(PUMP)["state"] == "on"
    audit = [json.loads(line) for line in (data_dir / "farm-state" / "audit.ndjson").read_text().splitlines()]
    assert [(a["group"], a["errorCode"], a["params"]["text"]) for a in audit] == [
        ("field", "unauthorized", "turn on the irrigation pump"),  # the trigger is not part of what Assist hears
        ("field", None, "turn on the irrigation pump"),
    ]
