"""The runner's prompt for a server's cache: a prefix that stays the same, a small offer, a budget it keeps.

Real agent runs (`python -m farmagent.run`) against the scripted LLM and the real daemon; the assertions are on
the requests the stub recorded and on the run log (stderr).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from agent_support import Farm, agent_input, run_agent
from farmagent.budget import estimate, prompt_limit
from farmagent.toolbox import DEFAULT_TOOLS
from farmhost_testing import FIELD_JID, scaled
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall, ToolCalls

from farmhost_dev.llm_relay import Relay
from farmhost_dev.local_llm import LocalLlm

FIELD = {"groupFolder": "field", "isMain": False, "chatJid": FIELD_JID}


def prefix(request: Recorded) -> str:
    """The system message and the tools, serialized as the runner serializes its request."""
    return json.dumps([request.messages[0], request.tools])


def test_the_system_prompt_and_tools_are_byte_identical_across_runs_times_and_groups(
    farm: Farm, llm_stub: ScriptedLLM
) -> None:
    llm_stub.script(then=Reply("Fine."))
    hit = [{"citation": "memory/pests.md#L1-L2", "groupFolder": "main", "snippet": "Aphids on field 3."}]
    runs = [
        (agent_input(now="2026-07-01T04:30:00Z"), "main"),
        (agent_input(now="2026-07-01T04:31:00Z", memory=hit, prompt="And the pump?"), "main"),  # a minute later
        (agent_input(now="2026-07-01T09:00:00Z", scheduled=True, taskId="t-1"), "main"),
        (agent_input(now="2026-07-01T04:32:00Z", **FIELD), "field"),  # another group
    ]
    for document, folder in runs:
        code, result, stderr = run_agent(document, farm.agent_env(folder, FARMAGENT_LLM_BASE_URL=llm_stub.base_url))
        assert code == 0, (result, stderr)
    first, later, scheduled, field = llm_stub.requests
    assert prefix(first) == prefix(later) == prefix(scheduled) == prefix(field)
    # What differs is after it, in the one user message of each run.
    assert "06:30" in first.messages[-1]["content"] and "06:31" in later.messages[-1]["content"]
    assert "Aphids on field 3." in later.messages[-1]["content"]
    assert "Group 'field', a group of the farm." in field.messages[-1]["content"]
    assert first.tool_names == [*DEFAULT_TOOLS, "find_tools", "use_tool"]
    assert len(json.dumps(first.tools)) < 6_000  # the whole catalog was ~20,000 characters


def test_a_hidden_tool_is_found_and_called_through_use_tool_and_still_checked(
    farm: Farm, llm_stub: ScriptedLLM
) -> None:
    def results(request: Recorded) -> list[dict[str, Any]]:
        return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]

    llm_stub.script(
        ToolCalls([ToolCall("find_tools", {"query": "dashboard"}), ToolCall("find_tools", {"query": "ping"})]),
        ToolCalls(
            [
                ToolCall("use_tool", {"name": "ping", "arguments": {}}),
                ToolCall("use_tool", {"name": "memory_get", "arguments": {"path": ""}}),  # too short: refused
                ToolCall("use_tool", {"name": "no_such_tool"}),
                ToolCall("memory_get", {"path": "MEMORY.md"}),  # a hidden tool called by its own name
            ]
        ),
        Reply("Done."),
    )
    code, result, stderr = run_agent(agent_input(), farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url))
    assert (code, result["toolCalls"]) == (0, 6), (result, stderr)
    _, second, third = llm_stub.requests
    dashboards, ping = results(second)
    names = [tool["name"] for tool in dashboards["tools"]]
    assert "ha_dashboard_patch" in names and "ha_capture_screenshot" in names
    patch = next(tool for tool in dashboards["tools"] if tool["name"] == "ha_dashboard_patch")
    assert "dashboard" in patch["description"] and patch["parameters"]["type"] == "object"
    assert [tool["name"] for tool in ping["tools"]] == ["ping"]
    pinged, short, unknown, memory = results(third)[2:]
    assert "errorCode" not in pinged, pinged
    assert short["errorCode"] == "invalid_request" and "path" in short["error"]
    assert unknown["errorCode"] == "invalid_request" and "no_such_tool" in unknown["error"]
    assert "San Marzano" in json.dumps(memory)


def test_another_group_cannot_use_a_main_only_tool_through_use_tool(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(
        ToolCalls(
            [
                ToolCall("find_tools", {"query": "register_group"}),
                ToolCall("use_tool", {"name": "register_group", "arguments": {"jid": "telegram:9"}}),
            ]
        ),
        Reply("I may not."),
    )
    env = farm.agent_env("field", FARMAGENT_LLM_BASE_URL=llm_stub.base_url)
    assert run_agent(agent_input(**FIELD), env)[0] == 0
    found, refused = (json.loads(m["content"]) for m in llm_stub.requests[1].messages if m["role"] == "tool")
    assert "register_group" not in json.dumps(found)
    assert refused["errorCode"] == "invalid_request" and "register_group" in refused["error"]
    assert farm.quarantine("field") == []  # refused in the sandbox: nothing was written for the host


def test_a_prompt_over_the_context_is_trimmed_and_the_run_log_says_what_went(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(then=Reply("Short answer."))
    stored = farm.workspace("field") / ".farmagent" / "conversation.json"
    stored.parent.mkdir(parents=True, exist_ok=True)
    old = [
        message
        for i in range(20)
        for message in (
            {"role": "user", "content": f"Question {i}: " + "how is the barley? " * 8},
            {"role": "assistant", "content": f"Answer {i}: " + "the barley is fine. " * 8},
        )
    ]
    stored.write_text(json.dumps({"version": 1, "messages": old}))
    hit = [{"citation": "memory/barley.md#L1", "groupFolder": "field", "snippet": "Barley sown in March."}]
    env = farm.agent_env("field", FARMAGENT_LLM_BASE_URL=llm_stub.base_url, FARMAGENT_LLM_CONTEXT_TOKENS="6144")
    code, result, stderr = run_agent(agent_input(**FIELD, contextMode="group", memory=hit, prompt="Barley?"), env)
    assert (code, result["answer"]) == (0, "Short answer."), stderr
    assert "context: 6144 tokens (FARMAGENT_LLM_CONTEXT_TOKENS)" in stderr
    (line,) = [line for line in stderr.splitlines() if "context: dropped" in line]
    assert re.search(r"dropped the \d+ oldest history message\(s\): the request needed about \d+ tokens", line)
    assert "memory hits" not in line  # the oldest history goes first
    request = llm_stub.requests[-1]
    assert estimate(request.messages, request.tools) <= prompt_limit(6144)
    assert "Question 0:" not in request.text() and "Answer 19:" in request.text()  # the newest history stays
    assert "Barley sown in March." in request.text() and request.messages[-1]["content"].endswith("Barley?")
    # The stored conversation is bounded by its own rules (40 messages), not by what this request could send.
    kept = json.loads(stored.read_text())["messages"]
    assert kept[0]["content"].startswith("Question 1:") and kept[-1]["content"] == "Short answer."

    hits = [{"citation": f"memory/n{i}.md#L1", "groupFolder": "field", "snippet": "rye " * 250} for i in range(4)]
    env["FARMAGENT_LLM_CONTEXT_TOKENS"] = "4096"
    code, result, stderr = run_agent(agent_input(**FIELD, memory=hits, prompt="Rye?"), env)
    assert code == 0, stderr
    assert "context: dropped the memory hits: the request needed about" in stderr
    request = llm_stub.requests[-1]
    assert "rye rye" not in request.text() and estimate(request.messages, request.tools) <= prompt_limit(4096)


def test_a_request_that_cannot_fit_ends_the_run_with_a_clear_error(farm: Farm, llm_stub: ScriptedLLM) -> None:
    env = farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url, FARMAGENT_LLM_CONTEXT_TOKENS="1024")
    code, result, stderr = run_agent(agent_input(), env)
    assert (code, result["status"]) == (1, "error"), stderr
    assert "more than the 768 this run may send to the model's 1024-token context" in result["error"]
    assert llm_stub.requests == []  # nothing was sent that the server would have truncated


def test_a_photo_counts_as_an_image_not_as_its_base64_text() -> None:
    text = {"type": "text", "text": "what is on this leaf?"}
    photo = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "A" * 400_000}}
    alone = estimate([{"role": "user", "content": [text]}], [])
    with_photo = estimate([{"role": "user", "content": [text, photo]}], [])
    assert with_photo - alone == 1000  # a 300 KB photo does not look like 133,000 tokens of text


@pytest.mark.slow  # the model reads the runner's ~1,500-token prompt once: 10-30 s on a loaded 2-core machine
@pytest.mark.timeout(300)
def test_a_chats_next_question_finds_the_earlier_exchange_in_llama_cpps_cache(farm: Farm, local_llm: LocalLlm) -> None:
    """`contextMode: group` on the real server: the second run reads its own section and question, not the first's."""
    stored = farm.workspace("main") / ".farmagent" / "conversation.json"
    stored.unlink(missing_ok=True)
    asked = (
        ("2026-07-01T04:30:00Z", "Explain step by step how to check the irrigation pump."),
        ("2026-07-01T04:31:00Z", "And how often should its filter be cleaned?"),
    )
    try:
        with Relay(local_llm.address, max_tokens=64) as relay:
            env = farm.agent_env(FARMAGENT_LLM_BASE_URL=relay.base_url, FARMAGENT_LLM_TIMEOUT="600")
            for now, prompt in asked:
                document = agent_input(now=now, prompt=prompt, contextMode="group", model=local_llm.model)
                code, result, stderr = run_agent(document, env, timeout=scaled(120))
                assert code == 0, (result, stderr)
    finally:
        stored.unlink(missing_ok=True)  # the session's other runs of main start without this conversation
    first, second = relay.exchanges
    # The whole first request is reused (its answer too, as far as the template renders it as generated) ...
    assert second.cache_n > first.prompt_tokens, (first, second)
    # ... and what is read anew is the second run's `## This run` section and question, whatever the answer's length.
    assert second.prompt_n < 200, (first, second)
