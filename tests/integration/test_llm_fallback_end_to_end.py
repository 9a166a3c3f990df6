"""The fallback chain end to end: a dead first endpoint, a real agent run answered by the second, then Assist.

Every part is real: the daemon (a subprocess), a bubblewrap agent run whose runner talks to farmhost's proxy, the
proxy trying a port nothing listens on and then the scripted chat-completions server on 127.0.0.1, the real Home
Assistant, a Telegram stand-in on 127.0.0.1, the outbox.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from farmhost_testing import MAIN_JID, clean_env, running_daemon
from ha_fixture import HaInstance
from llm_stub import ScriptedLLM, ToolCall, pump_state_reply
from telegram_stub import FakeTelegram

pytestmark = pytest.mark.slow  # end to end, several seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"


def _dead_url() -> str:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _env(ha_env: dict[str, str], fake_telegram: FakeTelegram, **llm: str) -> dict[str, str]:
    return clean_env(
        **ha_env,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        **llm,
    )


def test_a_dead_first_endpoint_and_the_second_answers_the_run(
    data_dir: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    dead = _dead_url()
    llm_stub.script(ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}), pump_state_reply)
    env = _env(
        ha_env,
        fake_telegram,
        FARMHOST_LLM_BASE_URL=dead,
        FARMHOST_LLM_MODEL="hosted-model",
        FARMHOST_LLM_API_KEY="sk-hosted",
        FARMHOST_LLM_2_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_2_MODEL="farm-model",
    )
    with running_daemon(data_dir, env=env) as daemon:
        fake_telegram.user_message(MAIN_CHAT, "Please turn the irrigation pump on", chat_type="private", title=None)
        (reply,) = fake_telegram.wait_sent(1, chat_id=MAIN_CHAT, timeout=60)
        log = daemon.log()
    assert ha_reset.get_state(PUMP)["state"] == "on"
    local = llm_stub.base_url.removeprefix("http://").removesuffix("/v1")
    hosted = dead.removeprefix("http://").removesuffix("/v1")
    assert str(reply.params["text"]).startswith(
        "Done: the irrigation pump is on.\n\n(answered by the fallback LLM endpoint 2, farm-model at "
        f"{local}: endpoint 1, hosted-model at {hosted}, did not answer)\n\nSeen in Home Assistant:\n"
    )
    assert [r.model for r in llm_stub.requests] == ["farm-model", "farm-model"]
    assert "authorization" not in llm_stub.requests[0].headers  # endpoint 2 has no key; endpoint 1's is not sent
    assert log.count(f"LLM endpoint 1 (hosted-model at {hosted}) failed: Connection refused") == 1
    assert "Traceback" not in log


def test_when_no_endpoint_answers_assist_answers_the_chat(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    env = _env(
        ha_env,
        fake_telegram,
        FARMHOST_LLM_BASE_URL=_dead_url(),
        FARMHOST_LLM_MODEL="hosted-model",
        FARMHOST_LLM_2_BASE_URL=_dead_url(),
        FARMHOST_LLM_2_MODEL="local-model",
    )
    with running_daemon(data_dir, env=env) as daemon:
        fake_telegram.user_message(MAIN_CHAT, "turn on the irrigation pump", chat_type="private", title=None)
        notice, reply = fake_telegram.wait_sent(2, chat_id=MAIN_CHAT, timeout=60)
        assert "Traceback" not in daemon.log()
    assert str(notice.params["text"]).startswith(
        "Answers in this chat come from Home Assistant's own assistant (Assist), because no configured LLM "
        "endpoint answered."
    )
    assert str(reply.params["text"]).startswith("Turned on the switch\n\nSeen in Home Assistant:\n")  # a receipt
    assert ha_reset.get_state(PUMP)["state"] == "on"
