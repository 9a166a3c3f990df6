"""The LLM proxy with a real upstream (the scripted chat-completions server) and the real openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from farmhost_testing import scaled, wait_for_async
from llm_stub import Fail, Raw, Reply, ScriptedLLM
from runtime_support import settings_for

from farmhost.agents.limits import LimitsReader
from farmhost.agents.photos import PreparedPhoto
from farmhost.agents.proxy.budget import ProxyUsage
from farmhost.agents.proxy.server import LlmProxy
from farmhost.config import Settings, build_config
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


def proxy_for(settings: Settings, layout: DataLayout, **options: Any) -> LlmProxy:
    """The proxy the runtime of `settings` builds: its LLM section, the limits file over the settings' defaults."""
    agents = build_config(settings).agents
    return LlmProxy(settings=agents.llm, layout=layout, limits=LimitsReader.of(layout.agent_limits, agents), **options)


@asynccontextmanager
async def proxied(
    settings: Settings, *, max_requests: int = 8, photos: Sequence[PreparedPhoto] = (), **options: Any
) -> AsyncIterator[tuple[openai.AsyncOpenAI, ProxyUsage, str]]:
    """A proxy serving group `field` (with the run's `photos`), and an openai client on its socket as an agent's."""
    layout = DataLayout(settings.data_dir)
    proxy = proxy_for(settings, layout, **options)
    await proxy.start()
    try:
        async with proxy.serve("field", "run-1", max_requests=max_requests, photos=photos) as usage:
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


async def test_a_stream_flag_that_is_not_a_boolean_is_refused(root: Path, llm: ScriptedLLM) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}
    async with (
        proxied(configured(root, llm)) as (_, usage, path),
        httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path)) as raw,
    ):
        refused = await raw.post("http://farmhost/v1/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == "stream must be true or false"
    assert llm.requests == [] and usage.requests == 0


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
    assert not_json.status_code == 400
    assert not_json.json()["error"]["message"] == (
        "the request body is not JSON (Expecting property name enclosed in double quotes at line 1, column 2)"
    )
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


# Issue 13: connections, deadlines, budgets and body fields ------------------------------------------------------

CHAT = "POST /v1/chat/completions HTTP/1.1\r\nHost: farmhost\r\nContent-Type: application/json\r\n"


def chat_body(text: str = "how are the pumps?") -> bytes:
    return json.dumps({"model": "x", "messages": [{"role": "user", "content": text}]}).encode()


@asynccontextmanager
async def raw_connections(path: str) -> AsyncIterator[Callable[[], Awaitable[tuple[asyncio.StreamReader, Any]]]]:
    """`connect()` opens a raw connection to the proxy socket; all are closed at the end of the block."""
    opened: list[asyncio.StreamWriter] = []

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(path)
        opened.append(writer)
        return reader, writer

    try:
        yield connect
    finally:
        for writer in opened:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def send_headers(writer: asyncio.StreamWriter, length: int) -> None:
    writer.write(f"{CHAT}Content-Length: {length}\r\n\r\n".encode())
    await writer.drain()


async def response_of(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the one response on a connection."""
    async with asyncio.timeout(scaled(10)):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        body = await reader.readexactly(length)
    return int(lines[0].split()[1]), json.loads(body)


async def closed_by_the_proxy(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(scaled(10)):
        return await reader.read() == b""


def limits_file(root: Path, document: dict[str, Any]) -> None:
    (root / "agent-limits.json").write_text(json.dumps(document))


async def test_connections_over_a_runs_cap_or_the_total_are_refused_at_once(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    settings = configured(root, llm, FARMHOST_LLM_RUN_CONNECTIONS="2", FARMHOST_LLM_MAX_CONNECTIONS="3")
    layout = DataLayout(settings.data_dir)
    proxy = proxy_for(settings, layout)
    await proxy.start()
    try:
        async with proxy.serve("field", "run-1", max_requests=8), proxy.serve("barn", "run-2", max_requests=8):
            dirs = [os.open(layout.group_run(folder), os.O_RDONLY | os.O_DIRECTORY) for folder in ("field", "barn")]
            field, barn = (f"/proc/self/fd/{fd}/llm.sock" for fd in dirs)  # the paths must fit sun_path
            async with raw_connections(field) as to_field, raw_connections(barn) as to_barn:
                held = [await to_field(), await to_field(), await to_barn()]
                for _, writer in held:
                    await send_headers(writer, 1000)  # and never the body
                over_run = await to_field()
                status, body = await response_of(over_run[0])
                assert status == 503
                assert "too many connections to the LLM proxy from this run (2 open)" in body["error"]["message"]
                assert await closed_by_the_proxy(over_run[0])
                over_total = await to_barn()
                status, body = await response_of(over_total[0])
                assert status == 503 and "from all runs (3)" in body["error"]["message"]
            async with raw_connections(field) as to_field:  # the held ones are gone: room again
                reader, writer = await to_field()
                writer.write(f"{CHAT}Content-Length: {len(chat_body())}\r\n\r\n".encode() + chat_body())
                assert (await response_of(reader))[0] == 200
            for fd in dirs:
                os.close(fd)
    finally:
        await proxy.stop()


async def test_a_connection_that_never_finishes_its_headers_or_idles_is_dropped(root: Path, llm: ScriptedLLM) -> None:
    async with proxied(configured(root, llm), idle_timeout=0.3) as (_, usage, path), raw_connections(path) as connect:
        slow_headers = await connect()
        slow_headers[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: farm")
        silent = await connect()
        assert await closed_by_the_proxy(slow_headers[0])
        assert await closed_by_the_proxy(silent[0])
    assert usage.requests == 0 and llm.requests == []


async def test_a_body_that_does_not_arrive_in_time_is_a_408(root: Path, llm: ScriptedLLM) -> None:
    async with proxied(configured(root, llm), body_timeout=0.3) as (_, usage, path), raw_connections(path) as connect:
        reader, writer = await connect()
        await send_headers(writer, 1000)
        writer.write(b'{"messages": [')
        status, body = await response_of(reader)
        assert status == 408 and body["error"]["message"] == "the request body did not arrive within 0.3 s"
        assert await closed_by_the_proxy(reader)
    assert usage.requests == 0 and llm.requests == []


async def test_concurrent_requests_with_slow_bodies_cannot_pass_the_run_budget(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    settings = configured(root, llm, FARMHOST_LLM_RUN_CONNECTIONS="32")
    async with proxied(settings, max_requests=3) as (_, usage, path), raw_connections(path) as connect:
        connections = [await connect() for _ in range(12)]
        body = chat_body()
        for _, writer in connections:
            await send_headers(writer, len(body))
        # Every request is past its headers (and its budget check) before any body is sent: the nine refused ones
        # are answered without one.
        await wait_for_async(lambda: usage.requests + usage.refused == 12, what="all 12 requests to be checked")
        for _, writer in connections:
            with contextlib.suppress(ConnectionError):
                writer.write(body)
                await writer.drain()
        statuses = sorted([(await response_of(reader))[0] for reader, _ in connections])
    assert statuses == [200] * 3 + [429] * 9
    assert len(llm.requests) == 3 and usage.requests == 3 and usage.refused == 9


async def test_a_groups_daily_request_budget_holds_across_runs_and_restarts(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    limits_file(root, {"default": {"llmRequestsPerDay": 50}, "groups": {"field": {"llmRequestsPerDay": 2}}})
    settings = configured(root, llm)
    async with proxied(settings) as (client, _, _):
        await ask(client)
    async with proxied(settings) as (client, usage, _):  # the next run, by a daemon started again
        await ask(client)
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(client)
    message = caught.value.message
    assert "group field has used its daily budget of 2 LLM requests; it resets at midnight Europe/Lisbon" in message
    assert caught.value.code == "daily_request_limit"
    assert len(llm.requests) == 2 and usage.refused == 1


async def test_a_groups_daily_token_budget_counts_the_upstreams_usage(root: Path, llm: ScriptedLLM) -> None:
    answer = (
        b'{"id": "c1", "object": "chat.completion", "created": 1, "model": "m", "choices": [{"index": 0, '
        b'"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], '
        b'"usage": {"prompt_tokens": 500, "completion_tokens": 3, "total_tokens": 503}}'
    )
    llm.script(Raw(answer), then=Reply("ok"))
    limits_file(root, {"groups": {"field": {"llmTokensPerDay": 200}}})
    settings = configured(root, llm, FARMHOST_LLM_MAX_TOKENS="16")
    async with proxied(settings) as (client, usage, _):
        await ask(client)  # its bound (a token a byte of the body, and 16) fits; the upstream reports 503
        assert (usage.prompt_tokens, usage.completion_tokens) == (500, 3)
        with pytest.raises(openai.RateLimitError) as caught:
            await ask(client)
    assert "group field has used its daily budget of 200 LLM tokens (503 used)" in caught.value.message
    async with proxied(settings) as (client, _, _):
        with pytest.raises(openai.RateLimitError):
            await ask(client)
    assert len(llm.requests) == 1


async def test_only_known_fields_are_forwarded_with_n_and_max_tokens_capped(root: Path, llm: ScriptedLLM) -> None:
    llm.script(then=Reply("ok"))
    async with proxied(configured(root, llm, FARMHOST_LLM_MAX_TOKENS="256")) as (client, usage, _):
        with pytest.raises(openai.BadRequestError) as caught:
            await ask(client, extra_body={"provider": {"order": ["expensive"]}, "service_tier": "priority"})
        await ask(client, n=64, max_tokens=999999, temperature=0.2)
        await ask(client, max_completion_tokens=100)
        await ask(client)
    assert "does not forward 'provider', 'service_tier'" in caught.value.message
    capped, completion, default = (r.body for r in llm.requests)
    assert capped["n"] == 1 and capped["max_tokens"] == 256 and capped["temperature"] == 0.2
    assert completion["max_completion_tokens"] == 100 and "max_tokens" not in completion
    assert default["max_tokens"] == 256
    assert usage.requests == 3


async def test_a_large_answer_is_forwarded_whole(root: Path, llm: ScriptedLLM) -> None:
    text = "soil moisture 31 % " * 100_000  # ~1.9 MB: many reads from the upstream
    llm.script(Reply(text))
    async with proxied(configured(root, llm)) as (client, _, _):
        answer = await ask(client)
    assert answer.choices[0].message.content == text


async def test_accept_failures_back_off_and_are_logged_once_per_change(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    llm.script(then=Reply("ok"))
    logger_name = "farmhost.agents.proxy.listener"
    with caplog.at_level(logging.INFO, logger=logger_name):
        async with proxied(configured(root, llm)) as (client, _, path):
            clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(4)]
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            filler: list[int] = []
            try:
                # No descriptor left for this process: the proxy's accept fails with EMFILE.
                resource.setrlimit(
                    resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1, hard)
                )
                with contextlib.suppress(OSError):
                    while True:
                        filler.append(os.dup(0))
                for conn in clients:
                    conn.setblocking(False)
                    conn.connect(path)  # into the listen backlog: needs no new descriptor
                await wait_for_async(
                    lambda: any("cannot accept connections" in r.getMessage() for r in caplog.records),
                    what="the accept failure to be logged",
                )
                await asyncio.sleep(0.3)  # not a wait for anything: time for several more failed tries
            finally:
                for fd in filler:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            await wait_for_async(
                lambda: any("accepting connections again" in r.getMessage() for r in caplog.records),
                what="the recovery to be logged",
            )
            answer = await ask(client)
            for conn in clients:
                conn.close()
    assert answer.choices[0].message.content == "ok"
    lines = [r for r in caplog.records if r.name == logger_name]
    assert [r.getMessage() for r in lines] == [
        "llm proxy field run run-1: cannot accept connections (Too many open files); retrying with backoff until it can",
        "llm proxy field run run-1: accepting connections again",
    ]
    assert all(r.exc_info is None for r in caplog.records)


async def test_a_client_gone_mid_body_or_sending_a_broken_body_costs_no_traceback(
    root: Path, llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        async with proxied(configured(root, llm)) as (_, usage, path), raw_connections(path) as connect:
            for _ in range(3):
                reader, writer = await connect()
                await send_headers(writer, 1000)
                writer.write(b'{"messages": [')
                await writer.drain()
                writer.close()
            reader, writer = await connect()
            writer.write(f"{CHAT}Transfer-Encoding: chunked\r\n\r\nzz\r\nnot a chunk\r\n".encode())
            async with asyncio.timeout(scaled(10)):
                status_line = await reader.readline()
            await wait_for_async(lambda: _handled(caplog) >= 3, what="the three cut requests to be logged")
    assert status_line.split()[1] == b"400"
    assert usage.requests == 0 and usage.refused == 0
    assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]
    assert llm.requests == []


def _handled(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if r.name == "farmhost.agents.proxy" and "HTTP " in r.getMessage())


@pytest.mark.parametrize("figure", [b"1e999", b"-1e999", b'"many"', b"NaN"])
async def test_an_upstream_usage_figure_that_is_no_count_costs_neither_the_answer_nor_the_proxy(
    root: Path, llm: ScriptedLLM, figure: bytes
) -> None:
    answer = (
        b'{"id": "c1", "object": "chat.completion", "created": 1, "model": "m", "choices": [{"index": 0, '
        b'"message": {"role": "assistant", "content": "The pumps are fine."}, "finish_reason": "stop"}], '
        b'"usage": {"prompt_tokens": ' + figure + b', "completion_tokens": 3, "total_tokens": 3}}'
    )
    llm.script(Raw(answer), Reply("and again"))
    async with proxied(configured(root, llm)) as (client, usage, _):
        first = await client.with_raw_response.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "how are the pumps?"}]
        )
        assert first.status_code == 200 and b"The pumps are fine." in first.content
        sent = llm.requests[0].body  # charged its bound: a token a byte of the body forwarded, and its max_tokens
        bound = (len(json.dumps({k: v for k, v in sent.items() if k != "model"})), sent["max_tokens"])
        assert usage.requests == 1 and (usage.prompt_tokens, usage.completion_tokens) == bound
        second = await ask(client)  # the proxy still serves the run
    assert second.choices[0].message.content == "and again"
    assert usage.requests == 2 and usage.prompt_tokens > 0


async def test_a_prompt_in_another_script_is_bounded_by_its_utf8_bytes_not_its_json_escapes(
    root: Path, llm: ScriptedLLM
) -> None:
    # 300 Cyrillic letters: 600 bytes of UTF-8, 1,800 as JSON's \u escapes. A budget between the two lets it pass.
    question = "полив" * 60
    llm.script(then=Reply("ok"))
    limits_file(root, {"groups": {"field": {"llmTokensPerDay": 1200}}})
    async with proxied(configured(root, llm, FARMHOST_LLM_MAX_TOKENS="16")) as (client, usage, _):
        answer = await ask(client, question)
    assert answer.choices[0].message.content == "ok"
    (seen,) = llm.requests
    assert seen.messages[0]["content"] == question  # the text upstream gets is the same
    assert usage.prompt_tokens > 0
