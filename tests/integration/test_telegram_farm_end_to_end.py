"""Issue 6's done-means, end to end with every part real.

A farmer writes in the (fake) Telegram main chat; farmhost receives it by long polling, runs an agent in
bubblewrap whose scripted LLM calls `farm_action` `ha_set_entity` on the real Home Assistant test instance;
the pump is on in HA; the agent's reply arrives in the chat through the durable outbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from farmhost_testing import MAIN_JID, clean_env, running_daemon
from ha_fixture import HaInstance
from llm_stub import ScriptedLLM, ToolCall, pump_state_reply
from telegram_stub import FakeTelegram

from farmhost.store.db import Database
from farmhost.store.transcripts import latest

pytestmark = pytest.mark.slow  # end to end, many seconds each (make test-fast leaves it out)

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"


def test_a_chat_message_turns_the_pump_on_in_home_assistant_and_the_reply_reaches_the_chat(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
) -> None:
    assert ha_reset.get_state(PUMP)["state"] == "off"
    llm_stub.script(ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}), pump_state_reply)
    env = clean_env(
        **ha_env,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY="sk-e2e",
    )
    with running_daemon(data_dir, env=env) as daemon:
        fake_telegram.user_message(MAIN_CHAT, "Please turn the irrigation pump on", chat_type="private", title=None)
        (reply,) = fake_telegram.wait_sent(1, chat_id=MAIN_CHAT, timeout=60)
        typing = [c for c in fake_telegram.calls if c.method == "sendChatAction"]
        assert "Traceback" not in daemon.log()

    assert ha_reset.get_state(PUMP)["state"] == "on"  # the agent really switched it, through farmhost
    answer, receipt = reply.params["text"].split("\n\n", 1)  # farmhost's receipt under the agent's words
    assert answer == "Done: the irrigation pump is on." and "✔ Irrigation pump off → on, " in receipt
    assert typing and typing[0].params["action"] == "typing"
    first = llm_stub.requests[0]
    assert "irrigation pump" in first.text() and first.headers["authorization"] == "Bearer sk-e2e"
    db = Database.open(data_dir)
    try:
        stored = [(m.direction, m.text) for m in latest(db.conn, [MAIN_JID])]
    finally:
        db.close()
    assert stored[0] == ("in", "Please turn the irrigation pump on")
    assert stored[1][0] == "out" and stored[1][1].startswith("Done: the irrigation pump is on.\n\nSeen in")
