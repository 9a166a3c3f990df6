"""Receipts, end to end: a bwrap agent run with the scripted LLM, the real HA, the real daemon, the fake Bot API.

Under the agent's words a reply carries what farmhost itself saw change in HA during the run; a run that changed
nothing carries none (so "Done!" without a tool call is visibly empty); a refused call says it failed.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import MAIN_JID, clean_env, running_daemon
from ha_fixture import HaInstance
from llm_stub import Reply, ScriptedLLM, ToolCall
from telegram_stub import FakeTelegram

from farmhost.farm.state.receipts import HEADING

pytestmark = pytest.mark.slow  # end to end, many seconds each (make test-fast leaves it out)

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
RELAY = "input_boolean.pump_relay"
ZONE = "Europe/Amsterdam"


def _at(ha: HaInstance, entity_id: str) -> str:
    changed = datetime.fromisoformat(ha.get_state(entity_id)["last_changed"])
    return f"{changed.astimezone(ZoneInfo(ZONE)):%H:%M}"


def test_a_reply_carries_exactly_what_farmhost_saw_change_and_nothing_when_nothing_changed(
    data_dir: Path,
    fake_telegram: FakeTelegram,
    llm_stub: ScriptedLLM,
    ha_reset: HaInstance,
    ha_env: dict[str, str],
) -> None:
    assert ha_reset.get_state(PUMP)["state"] == "off"
    llm_stub.script(
        ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}),
        Reply("The pump is on."),
        Reply("Done!"),  # no tool call at all
        ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}),  # already on: HA changes nothing
        Reply("It was on already."),
        ToolCall("ha_set_entity", {"entityId": "number.irrigation_duration", "value": 999}),
        Reply("Set to 999 minutes."),
    )
    env = clean_env(
        **ha_env,
        TZ=ZONE,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY="sk-e2e",
    )
    texts: list[str] = []
    with running_daemon(data_dir, env=env) as daemon:
        for n, words in enumerate(
            ("Turn the pump on", "Is all well?", "Make sure the pump is on", "Water for 999 minutes"), start=1
        ):
            fake_telegram.user_message(MAIN_CHAT, words, chat_type="private", title=None)
            texts.append(fake_telegram.wait_sent(n, chat_id=MAIN_CHAT, timeout=60)[-1].params["text"])
        assert "Traceback" not in daemon.log()

    turned_on, done, already, refused = texts
    answer, receipt = turned_on.split("\n\n", 1)
    assert answer == "The pump is on."
    heading, *lines = receipt.splitlines()
    assert heading == HEADING
    assert sorted(lines) == sorted(
        [f"✔ Irrigation pump off → on, {_at(ha_reset, PUMP)}", f"✔ Pump relay (sim) off → on, {_at(ha_reset, RELAY)}"]
    )
    assert done == "Done!"  # no tool call, no receipt
    assert already == "It was on already."  # the call ran, nothing changed: no receipt
    answer, receipt = refused.split("\n\n", 1)
    assert answer == "Set to 999 minutes."
    (line,) = receipt.splitlines()[1:]
    assert line.startswith("✘ set Irrigation duration to 999 failed (") and "✔" not in receipt
