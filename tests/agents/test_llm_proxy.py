"""The LLM proxy with a real upstream (the scripted chat-completions server) and the real openai client."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from llm_stub import Fail, Reply, ScriptedLLM
from runtime_support import settings_for

from farmhost.agents.proxy import LlmProxy, ProxyUsage
from farmhost.config import Settings
from farmhost.layout import DataLayout

KEY = "sk-upstream-secret-0123456789"
MODEL = "farm-model-7b"


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Deep on purpose: the socket's absolute path is over the 108 bytes of sun_path.
    root = tmp_path / ("deep-" * 16) / "data"
    root.mkdir(parents=True)
    return root


def configured(root: Path, llm: ScriptedLLM, **extra: Any) -> Settings:
    return settings_for(
        root, FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_API_KEY=KEY, FARMHOST_LLM_MODEL=MODEL, **extra
    )


@asynccontextmanager
async def proxied(
    settings: Settings, *, max_requests: int = 8, **options: Any
) -> AsyncIterator[tuple[openai.AsyncOpenAI, ProxyUsage, str]]:
    """A proxy serving group `field`, and an openai client that reaches it through its socket as an agent does."""
    layout = DataLayout(settings.data_dir)
    proxy = LlmProxy(settings=settings, layout=layout, **options)
    await proxy.start()
    try:
        async with proxy.serve("field", "run-1", max_requests=max_requests) as usage:
            directory = os.open(layout.group_run("field"), os.O_RDONLY | os.O_DIRECTORY)
            try:
                path = f"/proc/self/fd/{directory}/llm.sock"  # the client's path must fit sun_path too
                http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path))
                client = openai.AsyncOpenAI(base_url="http://farmhost/v1", api_key="agent-has-no-key", http_client=http)
                async with client:
                    yield client, usage, path
            finally:
                os.close(directory)
    finally:
        await proxy.stop()


async def ask(client: openai.AsyncOpenAI, text: str = "how are the pumps?", **extra: Any) -> Any:
    return await client.chat.completions.create(
        model="gpt-something-else", messages=[{"role": "user", "content": text}], **extra
    )


async def test_the_key_is_added_on_the_host_and_the_model_is_forced(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script(Reply("The pumps are fine."))
    with caplog.at_level(logging.INFO, logger="farmhost.agents.proxy"):
        async with proxied(configured(root, llm)) as (client, usage, _):
            answer = await ask(client)
    assert answer.choices[0].message.content == "The pumps are fine."
    (seen,) = llm.requests
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert "agent-has-no-key" not in json.dumps(seen.headers)
    assert seen.model == MODEL and answer.model == MODEL
    assert seen.messages == [{"role": "user", "content": "how are the pumps?"}]
    assert usage.requests == 1 and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    (line,) = [r.getMessage() for r in caplog.records if r.name == "farmhost.agents.proxy"]
    assert line.startswith("llm field run run-1: HTTP 200 in ")
    assert f"request 1 of 8; tokens so far {usage.prompt_tokens} prompt, {usage.completion_tokens} completion" in line


async def test_the_socket_exists_only_while_the_run_is_served(root: Path, llm: ScriptedLLM) -> None:
    socket_path = root / "run" / "field" / "llm.sock"
    async with proxied(configured(root, llm)):
        assert socket_path.is_socket()
        assert (socket_path.stat().st_mode & 0o777) == 0o666
        assert ((root / "run").stat().st_mode & 0o777) == 0o700
    assert not socket_path.exists()


async def test_the_agent_never_sees_the_key_even_when_the_upstream_echoes_it(root: Path, llm: ScriptedLLM) -> None:
    llm.script(Fail(401, f"Incorrect API key provided: {KEY}", type="invalid_request_error"))
    async with proxied(configured(root, llm)) as (client, _, _):
        with pytest.raises(openai.AuthenticationError) as caught:
            await ask(client)
    assert caught.value.status_code == 401
    assert KEY not in str(caught.value) and KEY not in caught.value.response.text
    assert "[redacted]" in caught.value.response.text


async def test_the_request_limit_of_a_run_answers_429(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    async with proxied(configured(root, llm), max_requests=2) as (client, usage, _):
        await ask(client)
        await ask(client)
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(client)  # the client retries 429 by default: the proxy says not to
    assert "used all of its 2 LLM requests" in caught.value.message
    assert len(llm.requests) == 2 and usage.refused == 1


async def test_streaming_is_refused_clearly(root: Path, llm: ScriptedLLM) -> None:
    async with proxied(configured(root, llm)) as (client, _, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client, stream=True)
    assert "streaming is not supported by the farmhost LLM proxy" in caught.value.message
    assert llm.requests == []


async def test_an_oversized_body_is_refused(root: Path, llm: ScriptedLLM) -> None:
    async with proxied(configured(root, llm), max_body_bytes=10_000) as (client, usage, _):
        with pytest.raises(openai.APIStatusError) as caught:
            await ask(client, "x" * 20_000)
    assert caught.value.status_code == 413
    assert "the request body is over 10000 bytes" in caught.value.message
    assert llm.requests == [] and usage.requests == 0


async def test_without_an_llm_the_proxy_says_what_to_set(root: Path) -> None:
    async with proxied(settings_for(root)) as (client, _, path):
        with pytest.raises(openai.APIStatusError) as caught:
            await ask(client)
        async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path)) as raw:
            models = await raw.get("http://farmhost/v1/models")
    assert caught.value.status_code == 503
    assert "set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL" in caught.value.message
    assert models.status_code == 503


async def test_an_unreachable_upstream_is_a_clear_502(root: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens here once the block ends
    settings = settings_for(
        root, FARMHOST_LLM_BASE_URL=f"http://127.0.0.1:{port}/v1", FARMHOST_LLM_API_KEY=KEY, FARMHOST_LLM_MODEL=MODEL
    )
    async with proxied(settings) as (client, _, _):
        with pytest.raises(openai.APIStatusError) as caught:
            await ask(client.with_options(max_retries=0))
    assert caught.value.status_code == 502
    assert "the host cannot reach the LLM endpoint (Connection refused)" in caught.value.message
    assert str(port) not in caught.value.message  # nothing of the endpoint's address reaches the agent


async def test_models_lists_the_forced_model_and_other_paths_are_404(root: Path, llm: ScriptedLLM) -> None:
    async with proxied(configured(root, llm)) as (client, _, path):
        models = await client.models.list()
        async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path)) as raw:
            missing = await raw.get("http://farmhost/v1/embeddings")
            wrong_method = await raw.get("http://farmhost/v1/chat/completions")
            not_json = await raw.post("http://farmhost/v1/chat/completions", content=b"{nope")
            not_object = await raw.post("http://farmhost/v1/chat/completions", json=[1, 2])
    assert [m.id for m in models.data] == [MODEL]
    assert missing.status_code == 404 and "use POST /v1/chat/completions" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 404
    assert not_json.status_code == 400 and not_json.json()["error"]["message"] == "the request body is not JSON"
    assert not_object.json()["error"]["message"] == "the request body must be a JSON object"
    assert llm.requests == []


async def test_upstream_errors_pass_through(root: Path, llm: ScriptedLLM) -> None:
    llm.script(Fail(400, "tools[0] is invalid", type="invalid_request_error"))
    async with proxied(configured(root, llm)) as (client, usage, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client)
    assert caught.value.message.endswith("tools[0] is invalid")
    assert usage.requests == 1 and usage.prompt_tokens == 0


async def test_a_slow_upstream_is_a_clear_502(root: Path, llm: ScriptedLLM) -> None:
    llm.script(lambda _: (time.sleep(0.6), Reply("too late"))[1])
    async with proxied(configured(root, llm), request_timeout=0.2) as (client, _, _):
        with pytest.raises(openai.APIStatusError) as caught:
            await ask(client.with_options(max_retries=0))
    assert caught.value.status_code == 502
    assert "the LLM endpoint did not answer within 0.2 s" in caught.value.message
    await asyncio.sleep(0.6)  # the stub's late answer hits a closed connection here, inside the test's capture
