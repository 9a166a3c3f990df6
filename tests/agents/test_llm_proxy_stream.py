"""The LLM proxy's streams: the real openai client over the proxy socket, the scripted server streaming upstream."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from farmhost_testing import scaled, wait_for_async
from llm_stub import Fail, Reply, ScriptedLLM, Streamed, ToolCall, ToolCalls
from openai.types.chat import ChatCompletionChunk
from test_llm_proxy import KEY, ask, configured, limits_file, proxied, proxy_for

from farmhost.layout import DataLayout

STREAM_LOGGER = "farmhost.agents.proxy.stream"


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / ("deep-" * 16) / "data"  # the socket's absolute path is over sun_path's 108 bytes
    root.mkdir(parents=True)
    return root


async def next_chunk(chunks: AsyncIterator[ChatCompletionChunk]) -> ChatCompletionChunk:
    async with asyncio.timeout(scaled(10)):
        return await anext(chunks)


def text_of(chunks: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def cut_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STREAM_LOGGER and r.levelno == logging.WARNING]


async def raw_stream(path: str, **extra: Any) -> tuple[int, str, bytes]:
    """Status, content type and the bytes the proxy relays for one streamed request (no client decoding)."""
    body = {"model": "x", "messages": [{"role": "user", "content": "how are the pumps?"}], "stream": True} | extra
    url = "http://farmhost/v1/chat/completions"
    async with (
        httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path)) as raw,
        raw.stream("POST", url, json=body) as response,
    ):
        data = b"".join([part async for part in response.aiter_raw()])
    return response.status_code, response.headers.get("content-type", ""), data


async def test_a_streamed_answer_reaches_the_agent_while_the_upstream_is_still_sending(
    root: Path, llm: ScriptedLLM
) -> None:
    reply = "The pumps are fine and the tank is full."
    held = Streamed(Reply(reply), chunk_chars=6, hold_after=3)  # the role and two pieces, then it waits
    llm.script(held)
    async with proxied(configured(root, llm)) as (client, usage, _):
        stream = await ask(client, stream=True)
        chunks = aiter(stream)
        first = [await next_chunk(chunks), await next_chunk(chunks), await next_chunk(chunks)]
        # The upstream has not sent the rest and cannot until it is released: what came was relayed, not buffered.
        assert text_of(first) == reply[:12] and llm.events_sent == 3
        held.release.set()
        rest = [chunk async for chunk in chunks]
    assert text_of(first + rest) == reply
    assert rest[-1].choices[0].finish_reason == "stop"
    assert all(chunk.choices for chunk in rest)  # the agent did not ask for the usage chunk: it is not passed on
    (sent,) = llm.requests
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
    (reported,) = llm.usages
    assert (usage.prompt_tokens, usage.completion_tokens) == (reported["prompt_tokens"], reported["completion_tokens"])


async def test_tool_call_deltas_and_the_usage_chunk_pass_through(root: Path, llm: ScriptedLLM) -> None:
    pump = {"domain": "switch", "service": "turn_on", "entity_id": "switch.pump_north"}
    llm.script(
        ToolCalls(
            [ToolCall("ha_call_service", pump, id="call_pump"), ToolCall("memory_search", {"query": "pump"}, id="c2")],
            text="Turning it on.",
        )
    )
    async with proxied(configured(root, llm)) as (client, _, _):
        stream = await ask(client, stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += (delta.function and delta.function.name) or ""
            call["arguments"] += (delta.function and delta.function.arguments) or ""
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("call_pump", "ha_call_service", pump),
        ("c2", "memory_search", {"query": "pump"}),
    ]
    assert text_of(chunks) == "Turning it on."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == llm.usages[0]["total_tokens"]


async def test_a_streams_usage_is_charged_to_the_groups_daily_token_budget(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok, the north pump is on"))
    # A stream's bound is about 160 (a token a byte of its body, and 16); the stub reports about 35 for it.
    limits_file(root, {"groups": {"field": {"llmTokensPerDay": 170}}})
    settings = configured(root, llm, FARMHOST_LLM_MAX_TOKENS="16")
    async with proxied(settings) as (client, usage, _):
        chunks = [chunk async for chunk in await ask(client, stream=True)]
        assert text_of(chunks) == "ok, the north pump is on"
        (reported,) = llm.usages
        assert usage.prompt_tokens + usage.completion_tokens == reported["total_tokens"]
        with pytest.raises(openai.RateLimitError) as caught:  # what it used and the next one's bound pass 170
            await ask(client, stream=True)
    assert caught.value.code == "daily_token_limit"
    assert f"daily budget of 170 LLM tokens ({reported['total_tokens']} used, 0 held" in caught.value.message
    async with proxied(settings) as (client, _, _):  # counted in the database: a restart does not forget it
        with pytest.raises(openai.RateLimitError):
            await ask(client, stream=True)
    assert len(llm.requests) == 1


async def test_an_upstream_cut_mid_stream_ends_the_agents_stream_with_an_error_event_logged_once(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script(Streamed(Reply("pump north on, pump south off"), chunk_chars=4, cut_after=4))
    llm.script(Streamed(Reply("pump north on, pump south off"), chunk_chars=4, cut_after=4))
    with caplog.at_level(logging.INFO):
        async with proxied(configured(root, llm)) as (client, usage, path):
            got: list[ChatCompletionChunk] = []
            stream = await ask(client, stream=True)
            with pytest.raises(openai.APIError) as caught:
                async for chunk in stream:
                    got.append(chunk)
            assert cut_warnings(caplog) == [
                "llm field run run-1: the stream was cut: the LLM endpoint's stream was cut (ClientPayloadError)"
            ]
            first_usage = (usage.prompt_tokens, usage.completion_tokens)
            status, content_type, relayed = await raw_stream(path)
    assert text_of(got) == "pump north o"  # what arrived before the cut
    assert caught.value.message == "the LLM endpoint's stream was cut (ClientPayloadError)"
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "upstream_unavailable"
    # A cut stream counts as a request, and is charged its bound (it sent no usage): a token a byte of the body
    # forwarded, and its max_tokens.
    assert usage.requests == 2
    sent = llm.requests[0].body
    assert first_usage == (len(json.dumps({k: v for k, v in sent.items() if k != "model"})), sent["max_tokens"])
    assert status == 200 and content_type.startswith("text/event-stream")
    events = relayed.split(b"\n\n")
    assert events[-1] == b"" and b"[DONE]" not in relayed
    error = json.loads(events[-2].removeprefix(b"data: "))
    assert error["error"]["code"] == "upstream_unavailable"
    assert len(cut_warnings(caplog)) == 2
    assert all(r.exc_info is None for r in caplog.records)


async def test_an_idle_upstream_is_cut_and_a_stream_is_bounded_by_the_upstream_timeout(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    stalled = Streamed(Reply("pump north on"), hold_after=2)
    try:
        llm.script(stalled)
        with caplog.at_level(logging.INFO):
            async with proxied(configured(root, llm), stream_idle_timeout=0.3) as (client, usage, _):
                with pytest.raises(openai.APIError) as idle:
                    _ = [chunk async for chunk in await ask(client, stream=True)]
    finally:
        stalled.release.set()
    assert idle.value.message == "the LLM endpoint sent nothing for 0.3 s"
    assert usage.requests == 1 and usage.completion_tokens > 0
    # A stream that keeps sending, but for longer than an answer may take (a chunk every 50 ms for 20 s; the headers come at once).
    llm.script(Streamed(Reply("x" * 400), chunk_chars=1, pace=0.05))
    async with proxied(configured(root, llm), request_timeout=2.0) as (client, _, _):
        with pytest.raises(openai.APIError) as endless:
            _ = [chunk async for chunk in await ask(client, stream=True)]
    assert endless.value.message == "the LLM endpoint's stream did not end within 2 s"
    assert cut_warnings(caplog) == [
        "llm field run run-1: the stream was cut: the LLM endpoint sent nothing for 0.3 s",
        "llm field run run-1: the stream was cut: the LLM endpoint's stream did not end within 2 s",
    ]


async def test_the_stream_idle_timeout_is_the_setting(root: Path, llm: ScriptedLLM) -> None:
    """FARMHOST_LLM_STREAM_IDLE_TIMEOUT (90 s by default) is how long the real proxy lets an upstream stay silent."""
    assert proxy_for(configured(root, llm), DataLayout(root)).rules.stream_idle_timeout == 90
    stalled = Streamed(Reply("pump north on, pump south off"), chunk_chars=4, hold_after=3)
    try:
        llm.script(stalled)
        async with proxied(configured(root, llm, FARMHOST_LLM_STREAM_IDLE_TIMEOUT="1")) as (client, usage, _):
            # Timed from before the request: the proxy's second of silence runs from its read of the third event,
            # which comes later. From the test's own read of that event instead, the relay's delay in between (a
            # loaded machine's stall) came off the second measured.
            asked = time.monotonic()
            chunks = aiter(await ask(client, stream=True))
            first = [await next_chunk(chunks), await next_chunk(chunks), await next_chunk(chunks)]
            with pytest.raises(openai.APIError) as idle:  # the upstream holds its fourth event
                await next_chunk(chunks)
            cut_after = time.monotonic() - asked
    finally:
        stalled.release.set()
    assert text_of(first) == "pump nor" and llm.events_sent == 3  # the role, then two pieces
    assert idle.value.message == "the LLM endpoint sent nothing for 1 s" and idle.value.code == "upstream_timeout"
    assert cut_after >= 0.9  # cut by the setting's second, not at once (and not after the default 90 s)
    assert usage.requests == 1 and usage.completion_tokens > 0  # the part that came is counted


async def test_the_key_never_reaches_the_agent_in_a_stream(root: Path, llm: ScriptedLLM) -> None:
    llm.script(Streamed(Reply(f"the endpoint says your key is {KEY}"), chunk_chars=1000))
    llm.script(Fail(401, f"Incorrect API key provided: {KEY}", type="invalid_request_error"))
    async with proxied(configured(root, llm)) as (client, _, path):
        status, content_type, relayed = await raw_stream(path)
        with pytest.raises(openai.AuthenticationError) as refused:
            await ask(client, stream=True)
    assert status == 200 and content_type.startswith("text/event-stream")
    assert KEY.encode() not in relayed and b"your key is [redacted]" in relayed
    assert relayed.endswith(b"data: [DONE]\n\n")
    assert llm.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in refused.value.response.text and "[redacted]" in refused.value.response.text


async def test_the_caps_apply_to_streams(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    async with proxied(configured(root, llm, FARMHOST_LLM_MAX_TOKENS="256"), max_requests=2) as (client, usage, _):
        first = [c async for c in await ask(client, stream=True, n=3, max_tokens=99999, stream_options={})]
        with pytest.raises(openai.BadRequestError) as unknown:
            await ask(client, stream=True, extra_body={"provider": {"order": ["expensive"]}})
        second = [c async for c in await ask(client, stream=True)]
        with pytest.raises(openai.RateLimitError) as over:
            await ask(client, stream=True)
    assert text_of(first) == text_of(second) == "ok"
    capped = llm.requests[0].body
    assert capped["n"] == 1 and capped["max_tokens"] == 256 and capped["stream_options"] == {"include_usage": True}
    assert "does not forward 'provider'" in unknown.value.message
    assert "used all of its 2 LLM requests" in over.value.message
    assert len(llm.requests) == 2 and usage.requests == 2 and usage.refused == 1


async def test_an_agent_that_leaves_a_stream_early_is_still_counted(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    held = Streamed(Reply("pump north on, pump south off"), chunk_chars=4, hold_after=3)
    llm.script(held, then=Reply("still here"))
    with caplog.at_level(logging.INFO, logger=STREAM_LOGGER):
        async with proxied(configured(root, llm)) as (client, usage, _):
            stream = await ask(client, stream=True)
            chunks = aiter(stream)
            for _ in range(3):
                await next_chunk(chunks)
            await stream.close()
            held.release.set()
            await wait_for_async(lambda: usage.completion_tokens > 0, what="the left stream's tokens to be counted")
            answer = await ask(client)
    assert answer.choices[0].message.content == "still here"
    assert usage.requests == 2
    assert [r.getMessage() for r in caplog.records if r.name == STREAM_LOGGER] == [
        "llm field run run-1: the agent closed its stream before the end"
    ]
