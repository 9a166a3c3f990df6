"""The LLM proxy's fallback chain with real upstreams on 127.0.0.1: a dead one, failing ones, answering ones."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from llm_stub import Fail, Raw, Reply, ScriptedLLM
from runtime_support import settings_for
from test_llm_proxy import ask, proxied

from farmhost.config import Settings
from farmhost_dev.testing import scaled

HOSTED_KEY = "sk-hosted-secret-0123456789"
LOCAL_KEY = "sk-local-secret-9876543210"


@pytest.fixture
def first() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture
def second() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as stub:
        yield stub


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


def dead_url() -> str:
    """The base URL of a port nothing listens on (the hosted endpoint while the farm's internet is down)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def chain(root: Path, first_url: str, second: ScriptedLLM, **extra: str) -> Settings:
    return settings_for(
        root,
        FARMHOST_LLM_BASE_URL=first_url,
        FARMHOST_LLM_MODEL="hosted-model",
        FARMHOST_LLM_API_KEY=HOSTED_KEY,
        FARMHOST_LLM_2_BASE_URL=second.base_url,
        FARMHOST_LLM_2_MODEL="local-model",
        FARMHOST_LLM_2_API_KEY=LOCAL_KEY,
        **extra,
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "LLM endpoint" in r.getMessage()]


async def test_a_dead_endpoint_is_skipped_and_the_next_one_answers(
    root: Path, second: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    second.script(Reply("Field 1 is fine."), Reply("Field 2 too."))
    local = second.base_url.removeprefix("http://").removesuffix("/v1")
    with caplog.at_level(logging.INFO, logger="farmhost.agents.proxy"):
        async with proxied(chain(root, dead_url(), second)) as (client, usage, _):
            assert (await ask(client)).choices[0].message.content == "Field 1 is fine."
            streamed = [chunk async for chunk in await ask(client, stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "Field 2 too."
    assert [r.model for r in second.requests] == ["local-model", "local-model"]  # each endpoint's own model and key
    assert all(r.headers["authorization"] == f"Bearer {LOCAL_KEY}" for r in second.requests)
    assert usage.answered_by == {2: f"local-model at {local}"} and usage.upstream_answers == 2
    (warning,) = _warnings(caplog)  # once, not per request
    assert warning.startswith("LLM endpoint 1 (hosted-model at 127.0.0.1:")
    assert "Connection refused" in warning and "tried last for 120 s; trying endpoint 2 (local-model at" in warning


async def test_a_failing_endpoint_is_tried_last_during_its_cool_down(
    root: Path, first: ScriptedLLM, second: ScriptedLLM
) -> None:
    first.script(Fail(503, "overloaded"), then=Reply("from the first"))
    second.script(then=Reply("from the second"))
    async with proxied(chain(root, first.base_url, second)) as (client, usage, _):
        answers = [(await ask(client)).choices[0].message.content for _ in range(3)]
    assert answers == ["from the second"] * 3
    assert len(first.requests) == 1, "cooling down: not asked again within FARMHOST_LLM_COOLDOWN_SECONDS"
    assert usage.answered_by == {2: usage.answered_by[2]} and usage.upstream_failures == 0  # every request answered


async def test_after_its_cool_down_the_first_endpoint_is_first_again(
    root: Path, first: ScriptedLLM, second: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    first.script(Fail(502, "bad gateway"), then=Reply("from the first"))
    second.script(then=Reply("from the second"))
    with caplog.at_level(logging.WARNING, logger="farmhost.agents.proxy"):
        async with proxied(chain(root, first.base_url, second, FARMHOST_LLM_COOLDOWN_SECONDS="0")) as (
            client,
            usage,
            _,
        ):
            answers = [(await ask(client)).choices[0].message.content for _ in range(2)]
    assert answers == ["from the second", "from the first"]
    assert sorted(usage.answered_by) == [1, 2]
    assert [w.split(":")[0] for w in _warnings(caplog)] == [
        "LLM endpoint 1 (hosted-model at 127.0.0.1",
        "LLM endpoint 1 (hosted-model at 127.0.0.1",
    ]
    assert _warnings(caplog)[1].endswith("answers again")


async def test_a_4xx_is_the_requests_fault_and_is_not_sent_elsewhere(
    root: Path, first: ScriptedLLM, second: ScriptedLLM
) -> None:
    first.script(Fail(400, "messages: too long"))
    second.script(then=Reply("never asked"))
    async with proxied(chain(root, first.base_url, second)) as (client, _, _):
        with pytest.raises(openai.BadRequestError, match="too long"):
            await ask(client)
    assert second.requests == []


async def test_when_every_endpoint_fails_the_agent_is_told_so(root: Path, second: ScriptedLLM) -> None:
    second.script(then=Fail(500, "model crashed"))
    settings = chain(root, dead_url(), second)
    async with proxied(settings) as (client, usage, _):
        with pytest.raises(openai.InternalServerError, match="model crashed"):
            await ask(client.with_options(max_retries=0))
    assert usage.upstream_failures == 1 and usage.upstream_answers == 0 and usage.answered_by == {}
    second.close()  # now both are dead
    async with proxied(settings) as (client, usage, _):
        with pytest.raises(openai.APIStatusError, match="cannot reach any of the 2 LLM endpoints") as raised:
            await ask(client.with_options(max_retries=0))
    assert raised.value.status_code == 502 and usage.upstream_failures == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_an_endpoint_that_timed_out_is_charged_its_bound_when_the_next_one_answers(
    root: Path, first: ScriptedLLM, second: ScriptedLLM, stream: bool
) -> None:
    # Endpoint 1 took the request and may have done the work (a hosted model thinking past the deadline bills it)
    # before the proxy gave up on it: as when no endpoint answers, that request keeps its bound.
    gate = threading.Event()
    first.script(lambda _: (gate.wait(scaled(30)), Raw(b"{}"))[1])  # Raw: its late answer may find no one
    second.script(then=Reply("from the second"))
    # A stream waits for endpoint 1's headers for the idle timeout, out of the whole exchange's request timeout.
    # Each as long as endpoint 2 may need to answer on a busy machine, since it gets the same.
    timeouts = {"request_timeout": scaled(20 if stream else 2), "stream_idle_timeout": scaled(2)}
    try:
        async with proxied(chain(root, first.base_url, second), **timeouts) as (client, usage, _):
            if stream:
                chunks = [chunk async for chunk in await ask(client, stream=True, max_tokens=50)]
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                text = (await ask(client, max_tokens=50)).choices[0].message.content
    finally:
        gate.set()
    assert text == "from the second" and len(first.requests) == 1
    (reported,) = second.usages
    assert usage.completion_tokens == reported["completion_tokens"] + 50  # endpoint 1's max_tokens, and 2's answer
    # and endpoint 1's prompt: a token a byte of its body, which holds the messages
    assert usage.prompt_tokens >= reported["prompt_tokens"] + len(json.dumps(first.requests[0].messages))
