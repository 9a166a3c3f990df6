"""The scripted chat-completions stub answers like the OpenAI API, as the real openai client sees it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import openai
import pytest
from llm_stub import Fail, Reply, ScriptedLLM, ToolCall, ToolCalls


def test_the_openai_client_reads_its_answers(llm_stub: ScriptedLLM) -> None:
    llm_stub.script(
        ToolCalls([ToolCall("ping", {}, id="call_1"), ToolCall("memory_get", {"path": "MEMORY.md"})], text="Checking."),
        lambda request: Reply(f"saw {len(request.messages)} messages"),
    )
    with openai.OpenAI(base_url=llm_stub.base_url, api_key="test-key", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["stub-model"]
        first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        second = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}] * 3)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    calls = choice.message.tool_calls or []
    summary = [(c.id, c.type, c.function.name, json.loads(c.function.arguments)) for c in calls]  # type: ignore[union-attr]
    assert summary == [
        ("call_1", "function", "ping", {}),
        (summary[1][0], "function", "memory_get", {"path": "MEMORY.md"}),
    ]
    assert summary[1][0].startswith("call_")
    assert first.usage is not None and first.usage.total_tokens > 0 and first.object == "chat.completion"
    assert second.choices[0].message.content == "saw 3 messages" and second.choices[0].finish_reason == "stop"
    assert [r.headers["authorization"] for r in llm_stub.requests] == ["Bearer test-key"] * 2
    assert llm_stub.requests[1].model == "m"


def test_errors_come_with_openai_error_bodies(llm_stub: ScriptedLLM) -> None:
    llm_stub.script(Fail(400, "bad tools", code="invalid_tools"))
    with openai.OpenAI(base_url=llm_stub.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.code == "invalid_tools" and "bad tools" in caught.value.message
        with pytest.raises(openai.InternalServerError, match="exhausted"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    with httpx2.Client(base_url=llm_stub.base_url) as raw:
        assert raw.get("/nowhere").json()["error"]["message"] == "no route GET /v1/nowhere"
    assert len(llm_stub.wait_requests(2)) == 2


def test_a_chunked_request_body_is_read_like_a_sized_one(llm_stub: ScriptedLLM) -> None:
    llm_stub.script(Reply("chunked ok"))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()

    def stream() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    with httpx2.Client(base_url=llm_stub.base_url) as raw:
        answer = raw.post("/chat/completions", content=stream(), headers={"Content-Type": "application/json"})
    assert answer.json()["choices"][0]["message"]["content"] == "chunked ok"
    assert llm_stub.requests[0].messages == [{"role": "user", "content": "hi"}]
