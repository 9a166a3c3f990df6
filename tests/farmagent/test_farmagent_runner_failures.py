"""`python -m farmagent.run` when things go wrong: turn limit, LLM failures, bad stdin, bad environment."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from agent_support import Farm, agent_input, run_agent
from llm_stub import Fail, Raw, Reply, ScriptedLLM, ToolCall


def test_the_turn_limit_stops_an_endless_tool_loop(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(then=ToolCall("ping", {}))
    code, result, _ = run_agent(agent_input(maxTurns=3), farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url))
    assert code == 1 and result["status"] == "error" and result["answer"] is None
    assert "turn limit" in result["error"] and (result["turns"], result["toolCalls"]) == (3, 3)
    assert len(llm_stub.requests) == 3


@pytest.mark.parametrize(
    ("failure", "requests", "message"),
    [
        (Fail(500, "the model server crashed"), 2, "HTTP 500 (also after 1 retries): the model server crashed"),
        (
            Fail(400, "maximum context length exceeded", code="context_length_exceeded"),
            1,
            "refused the request with HTTP 400: maximum context",
        ),
    ],
    ids=["500", "400"],
)
def test_llm_errors_end_the_run_with_a_clear_error(
    farm: Farm, llm_stub: ScriptedLLM, failure: Fail, requests: int, message: str
) -> None:
    llm_stub.script(then=failure)
    env = farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url, FARMAGENT_LLM_MAX_RETRIES="1")
    code, result, stderr = run_agent(agent_input(), env)
    assert code == 1 and result["status"] == "error" and result["turns"] == 1
    assert message in result["error"] and llm_stub.base_url in result["error"], result
    assert len(llm_stub.requests) == requests
    assert message in stderr


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Raw(b"<html>bad gateway</html>"), "answered something unusable: not JSON"),
        (Raw(b'{"id": "x"}'), "answered something unusable: no `choices` list"),
        (Raw(b'{"choices": []}'), "answered without any choice"),
        (Raw(b'{"choices": [{"message": {"content": 7}}]}'), "the message's content is not text"),
        (Raw(b'{"choices": [{"message": {"tool_calls": [{"id": "c1"}]}}]}'), "a tool call without a function"),
        (
            Raw(
                b'{"choices": [{"message": {"tool_calls": [{"id": "c1", "function": {"name": "ping", "arguments": {}}}]}}]}'
            ),
            "a tool call's arguments must be JSON text",
        ),
        (Raw(b"{}", status=502), "HTTP 502 (also after 1 retries): {}"),
        (Raw(b" " * (16 * 1024 * 1024 + 1)), "answered something unusable: more than 16777216 bytes"),
    ],
    ids=["html", "no-choices", "empty-choices", "content", "call", "arguments", "502-raw", "oversize"],
)
def test_an_unusable_answer_ends_the_run_with_what_was_wrong(
    farm: Farm, llm_stub: ScriptedLLM, answer: Raw, message: str
) -> None:
    llm_stub.script(then=answer)
    env = farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url, FARMAGENT_LLM_MAX_RETRIES="1")
    code, result, _ = run_agent(agent_input(), env)
    assert code == 1 and result["status"] == "error" and message in result["error"], result
    assert len(llm_stub.requests) == (2 if answer.status >= 500 else 1)


def test_a_late_answer_is_a_timeout_and_should_retry_false_is_not_retried(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(Raw(b"{}", delay=5.0), then=Fail(500, "budget spent", should_retry=False))
    env = farm.agent_env(
        FARMAGENT_LLM_BASE_URL=llm_stub.base_url, FARMAGENT_LLM_TIMEOUT="1", FARMAGENT_LLM_MAX_RETRIES="0"
    )
    code, result, _ = run_agent(agent_input(), env)
    assert code == 1 and result["error"] == f"the LLM at {llm_stub.base_url} did not answer in time (1.0 s)", result
    code, result, _ = run_agent(agent_input(), {**env, "FARMAGENT_LLM_MAX_RETRIES": "3", "FARMAGENT_LLM_TIMEOUT": "30"})
    assert code == 1 and "HTTP 500 (also after 0 retries): budget spent" in result["error"], result
    assert len(llm_stub.requests) == 2  # the late one, then the refusal once: `x-should-retry: false` is obeyed


def test_rate_limits_are_retried_and_an_unreachable_llm_is_an_error(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(Fail(429, "slow down", type="rate_limit_error", retry_after_ms=50), Reply("Fine."))
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    with ThreadPoolExecutor(2) as pool:
        limited = pool.submit(run_agent, agent_input(), farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url))
        gone = pool.submit(
            run_agent, agent_input(), farm.agent_env(FARMAGENT_LLM_BASE_URL=url, FARMAGENT_LLM_MAX_RETRIES="0")
        )
        (code, result, _), (gone_code, gone_result, _) = limited.result(), gone.result()
    assert (code, result["answer"]) == (0, "Fine.") and len(llm_stub.requests) == 2
    assert gone_code == 1 and gone_result["error"].startswith(f"cannot reach the LLM at {url}"), gone_result


@pytest.mark.parametrize(
    ("stdin", "env", "message"),
    [
        (b"{'version': 1}", {}, "the AgentInput is not valid JSON"),
        (json.dumps(agent_input()).encode(), {"FARMAGENT_LLM_BASE_URL": "ftp://llm"}, "FARMAGENT_LLM_BASE_URL must be"),
    ],
    ids=["input", "environment"],
)
def test_unusable_input_exits_2_with_one_clear_result_line(
    farm: Farm, stdin: bytes, env: dict[str, str], message: str
) -> None:
    code, result, stderr = run_agent(stdin, farm.agent_env(**env))  # the other refusals: test_farmagent_contract.py
    assert code == 2 and result["status"] == "error" and (result["turns"], result["toolCalls"]) == (0, 0)
    assert message in result["error"], result
    assert message in stderr
