"""The host learns each LLM endpoint's context where the server says it (farmhost/agents/proxy/context.py).

Real HTTP on 127.0.0.1 throughout: llama.cpp's own server (the session's `local_llm`, 4096 tokens) answers
`GET /props`; the scripted stub stands in for Ollama with Ollama's `/api/show` and `/api/ps` shapes (there is no
Ollama binary here), and without them for a hosted API that says nothing; a socket that accepts and never answers
is an endpoint gone silent.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from farmagent.budget import estimate, prompt_limit
from farmhost_testing import MAIN_JID, clean_env, farmhost, running_daemon, scaled, wait_for
from telegram_stub import FakeTelegram

from farmhost.agents.proxy.context import OLLAMA_DEFAULT_CONTEXT, ContextSize, ContextSizes
from farmhost.config import LlmEndpoint
from farmhost_dev.llm_stub import OllamaModel, Reply, ScriptedLLM
from farmhost_dev.local_llm import CONTEXT_TOKENS, LocalLlm

OLLAMA_MODEL = "qwen2.5:1.5b"
MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))


def endpoint(number: int, base_url: str, model: str) -> LlmEndpoint:
    return LlmEndpoint(number, base_url, model)


def host(base_url: str) -> str:
    return f"127.0.0.1:{urlsplit(base_url).port}"


async def asked(*endpoints: LlmEndpoint, setting: int | None = None, run_wait: float = 10.0) -> ContextSize | None:
    sizes = ContextSizes(endpoints, setting=setting, run_wait=scaled(run_wait))
    sizes.start()
    try:
        return await sizes.for_run()
    finally:
        await sizes.stop()


@pytest.fixture
def ollama() -> Iterator[ScriptedLLM]:
    with ScriptedLLM(model=OLLAMA_MODEL, ollama=OllamaModel(num_ctx=6144)) as stub:
        yield stub


async def test_llama_cpp_says_its_slots_context_in_props(local_llm: LocalLlm) -> None:
    size = await asked(endpoint(1, local_llm.base_url, local_llm.model))
    where = f"endpoint 1, smollm2 at {host(local_llm.base_url)}"
    assert size == ContextSize(CONTEXT_TOKENS, f"llama.cpp /props of {where}")


def test_doctor_says_the_context_the_server_says(tmp_path: Path, local_llm: LocalLlm, ollama: ScriptedLLM) -> None:
    env = clean_env(
        FARMHOST_AGENT_RUNTIME="process",
        FARMHOST_LLM_BASE_URL=local_llm.base_url,
        FARMHOST_LLM_MODEL=local_llm.model,
        FARMHOST_LLM_2_BASE_URL=ollama.base_url,
        FARMHOST_LLM_2_MODEL=OLLAMA_MODEL,
    )
    done = farmhost("doctor", "--json", data_dir=tmp_path / "data", env=env)
    checks = {c["part"]: c for c in json.loads(done.stdout)}
    first, second = checks["llm"], checks["llm 2"]
    assert first["state"] == "ok" and first["detail"].endswith(
        f", context {CONTEXT_TOKENS:,} tokens (llama.cpp /props of endpoint 1, smollm2 at {host(local_llm.base_url)})"
    ), first
    assert second["state"] == "ok" and ", context 6,144 tokens (Ollama's num_ctx of qwen2.5:1.5b" in second["detail"]


async def test_ollama_says_the_models_num_ctx_which_its_openai_api_uses(ollama: ScriptedLLM) -> None:
    size = await asked(endpoint(1, ollama.base_url, OLLAMA_MODEL))
    where = f"endpoint 1, {OLLAMA_MODEL} at {host(ollama.base_url)}"
    assert size == ContextSize(6144, f"Ollama's num_ctx of {OLLAMA_MODEL} ({where})")
    assert ollama.paths == ["GET /props", "POST /api/show"]  # llama.cpp's question first, beside the /v1


@pytest.mark.parametrize(
    ("model", "tokens", "source"),
    [
        (OllamaModel(loaded_context=8192), 8192, "Ollama's loaded context of"),
        (OllamaModel(), OLLAMA_DEFAULT_CONTEXT, "Ollama's default context,"),  # 32k trained, not loaded: 4096
        (OllamaModel(trained_context=2048), 2048, "Ollama's default context,"),  # never more than the model's own
    ],
)
async def test_without_num_ctx_ollama_is_taken_at_its_loaded_or_default_context(
    model: OllamaModel, tokens: int, source: str
) -> None:
    with ScriptedLLM(model=OLLAMA_MODEL, ollama=model) as stub:
        size = await asked(endpoint(1, stub.base_url, OLLAMA_MODEL))
    assert size is not None and size.tokens == tokens and size.source.startswith(source), size


async def test_the_run_gets_the_smallest_of_the_chain_and_the_setting(
    local_llm: LocalLlm, ollama: ScriptedLLM, llm_stub: ScriptedLLM
) -> None:
    chain = (
        endpoint(1, llm_stub.base_url, "hosted"),  # says nothing: only the setting covers it
        endpoint(2, ollama.base_url, OLLAMA_MODEL),  # 6144
        endpoint(3, local_llm.base_url, local_llm.model),  # 4096
    )
    size = await asked(*chain)
    assert size is not None and (size.tokens, size.source.split(" of ")[0]) == (4096, "llama.cpp /props")
    assert await asked(*chain, setting=3000) == ContextSize(3000, "FARMHOST_LLM_CONTEXT_TOKENS")
    assert await asked(chain[0]) is None  # nothing known: the runner trims nothing beyond its own bounds
    assert llm_stub.paths == ["GET /props", "POST /api/show"] * 3 and llm_stub.requests == []  # one ask a start


async def test_an_endpoint_that_never_answers_holds_no_run_beyond_the_first_wait() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts connections; nobody reads them
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        sizes = ContextSizes((endpoint(1, url, "gone"),), setting=4096, ask_timeout=scaled(60), run_wait=0.5)
        sizes.start()
        try:
            began = time.monotonic()
            first = await sizes.for_run()
            waited = time.monotonic() - began
            began = time.monotonic()
            second = await sizes.for_run()  # the question is still out: this run does not wait for it
            again = time.monotonic() - began
        finally:
            await sizes.stop()
    finally:
        silent.close()
    assert first == second == ContextSize(4096, "FARMHOST_LLM_CONTEXT_TOKENS")
    assert waited < scaled(30) and again < waited  # far below the question's own 60 s; the second waits nothing


def long_history(data_dir: Path, exchanges: int = 20) -> None:
    """A conversation of main (`contextMode: group`, a chat's) far longer than a 4k context holds."""
    stored = data_dir / "groups" / "main" / ".farmagent" / "conversation.json"
    stored.parent.mkdir(parents=True, exist_ok=True)
    old = [
        message
        for i in range(exchanges)
        for message in (
            {"role": "user", "content": f"Question {i}: " + "how wet is the north field today? " * 8},
            {"role": "assistant", "content": f"Answer {i}: " + "the north field is wet enough. " * 8},
        )
    ]
    stored.write_text(json.dumps({"version": 1, "messages": old}))


def chat_run(data_dir: Path, telegram: FakeTelegram, base_url: str, model: str, **env: str) -> str:
    """A chat message to main through the daemon, the built-in runner in bwrap, the proxy; the run's log."""
    settings = clean_env(
        TELEGRAM_BOT_TOKEN=telegram.token,
        TELEGRAM_API_BASE_URL=telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_AGENT_KIND="farmagent",
        FARMHOST_LLM_BASE_URL=base_url,
        FARMHOST_LLM_MODEL=model,
        FARMHOST_AGENT_MAX_TURNS="1",
        FARMHOST_AGENT_TIMEOUT_SECONDS="120",
        **env,
    )
    with running_daemon(data_dir, env=settings) as daemon:
        telegram.user_message(MAIN_CHAT, "Is the irrigation pump on?", chat_type="private", title=None)
        telegram.wait_sent(1, chat_id=MAIN_CHAT, timeout=scaled(100))
        logs = wait_for(lambda: sorted((data_dir / "logs" / "runs" / "main").glob("*.log")), what="the run log")
        assert "Traceback" not in daemon.log()
    (log_path,) = logs
    return log_path.read_text()


def dropped_line(log: str) -> str:
    (line,) = [line for line in log.splitlines() if "context: dropped" in line]
    return line


@pytest.mark.slow  # the model reads a ~2,500-token prompt: 10-30 s on a loaded 2-core machine
@pytest.mark.timeout(180)
def test_through_the_proxy_the_runner_trims_to_what_llama_cpp_says(
    data_dir: Path, fake_telegram: FakeTelegram, local_llm: LocalLlm
) -> None:
    """No FARMHOST_LLM_CONTEXT_TOKENS: the host asks the server, the runner fits its prompt and says what it dropped."""
    long_history(data_dir)
    log = chat_run(data_dir, fake_telegram, local_llm.base_url, local_llm.model, FARMHOST_LLM_MAX_TOKENS="16")
    where = f"endpoint 1, smollm2 at {host(local_llm.base_url)}"
    assert f"context: {CONTEXT_TOKENS} tokens (llama.cpp /props of {where})" in log
    line = dropped_line(log)
    assert re.search(rf"dropped the \d+ oldest history message\(s\): .* {CONTEXT_TOKENS}-token context", line), line
    assert re.search(r"^status: ok, exit code 0$", log, re.MULTILINE), log[-3000:]  # the server took the prompt
    with sqlite3.connect(data_dir / "farmhost.db") as conn:
        (prompt_tokens,) = conn.execute("SELECT SUM(prompt_tokens) FROM llm_usage WHERE folder = 'main'").fetchone()
    assert 0 < prompt_tokens <= prompt_limit(CONTEXT_TOKENS)  # the server's own count, the estimate on the safe side


@pytest.mark.timeout(120)
def test_through_the_proxy_the_runner_trims_to_ollamas_num_ctx(data_dir: Path, fake_telegram: FakeTelegram) -> None:
    long_history(data_dir, exchanges=30)
    with ScriptedLLM(model=OLLAMA_MODEL, ollama=OllamaModel(num_ctx=6144), then=Reply("It is off.")) as ollama:
        log = chat_run(data_dir, fake_telegram, ollama.base_url, OLLAMA_MODEL)
    assert f"context: 6144 tokens (Ollama's num_ctx of {OLLAMA_MODEL} (endpoint 1," in log
    assert "oldest history message(s)" in dropped_line(log)
    (request,) = ollama.requests
    assert estimate(request.messages, request.tools) <= prompt_limit(6144)
    assert "Question 0:" not in request.text() and "Answer 29:" in request.text()  # the newest exchanges stay
    assert ollama.paths[:2] == ["GET /props", "POST /api/show"]  # asked by the host, not from the sandbox
