"""The host learns each LLM endpoint's context where the server says it (farmhost/agents/proxy/context.py).

Real HTTP on 127.0.0.1 throughout: llama.cpp's own server (the session's `local_llm`, 4096 tokens) answers
`GET /props`; the scripted stub stands in for Ollama with Ollama's `/api/show` and `/api/ps` shapes (there is no
Ollama binary here), and without them for a hosted API that says nothing; a socket that accepts and never answers
is an endpoint gone silent.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from farmhost_testing import scaled

from farmhost.agents.proxy.context import OLLAMA_DEFAULT_CONTEXT, ContextSize, ContextSizes
from farmhost.config import LlmEndpoint
from farmhost_dev.llm_stub import OllamaModel, ScriptedLLM
from farmhost_dev.local_llm import CONTEXT_TOKENS, LocalLlm

OLLAMA_MODEL = "qwen2.5:1.5b"


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
