"""`python -m farmagent.run` end to end: the real openai client against the scripted LLM, real tools, real daemon."""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_support import Farm, agent_input, run_agent
from farmagent.toolbox import DEFAULT_TOOLS
from farmhost_testing import FIELD_JID
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall, ToolCalls

from farmhost.store import outbox
from farmhost.store.db import Database

SNIPPET = "Field 3 had aphids on 12 June; neem oil worked within four days."


def outbox_bodies(data_dir: Path) -> list[tuple[str, str | None]]:
    db = Database.open(data_dir)
    try:
        return [(e.chat_jid, e.body) for e in outbox.list_entries(db.conn, limit=100_000)]
    finally:
        db.close()


def test_memory_search_then_send_message_then_answer(farm: Farm, llm_stub: ScriptedLLM) -> None:
    def after_search(request: Recorded) -> ToolCall | Reply:
        result = json.loads(request.last_tool_result() or "{}")
        snippets = [hit["snippet"] for hit in result.get("hits", [])]
        if not any("San Marzano" in s for s in snippets):
            return Reply(f"memory_search did not find the tomatoes: {result}")
        return ToolCall("send_message", {"chatJid": FIELD_JID, "text": "Reminder: the north field has San Marzano."})

    llm_stub.script(
        ToolCall("memory_search", {"query": "tomatoes"}),
        after_search,
        Reply("The north field grows San Marzano tomatoes; I told the field crew."),
    )
    memory = [{"citation": "memory/pests.md#L4-L6", "groupFolder": "main", "snippet": SNIPPET}]
    code, result, stderr = run_agent(
        agent_input(memory=memory), farm.agent_env(FARMAGENT_LLM_BASE_URL=llm_stub.base_url)
    )

    assert (code, result) == (
        0,
        {
            "status": "ok",
            "answer": "The north field grows San Marzano tomatoes; I told the field crew.",
            "error": None,
            "turns": 3,
            "toolCalls": 2,
        },
    ), stderr
    assert (FIELD_JID, "Reminder: the north field has San Marzano.") in outbox_bodies(farm.data_dir)

    first, second, third = llm_stub.requests
    assert first.model == "farm-model"
    assert first.headers["authorization"] == "Bearer farmhost-proxy"
    # The small default set and the lister, not the whole catalog; memory_search was offered, send_message too.
    assert first.tool_names == [*DEFAULT_TOOLS, "find_tools", "use_tool"]
    assert [m["role"] for m in first.messages] == ["system", "user"]
    # The run's own facts come with the request, after the system prompt that stays the same.
    request = first.messages[-1]["content"]
    assert "[main:memory/pests.md#L4-L6] " + SNIPPET in request  # the host's snippets, with their citation
    assert "Europe/Amsterdam" in request and "2026-07-01 06:30" in request  # 04:30 UTC in the farm's zone
    assert "San Marzano tomatoes" in request  # the head of the group's MEMORY.md
    assert request.endswith("## The request\nHow are the tomatoes?")
    assert "2026-07-01" not in first.system and "San Marzano" not in first.system
    assert "San Marzano" in (second.last_tool_result() or "")
    assert json.loads(third.last_tool_result() or "{}")["queued"] is True


def test_tool_errors_go_back_to_the_model(farm: Farm, llm_stub: ScriptedLLM) -> None:
    llm_stub.script(
        ToolCalls(
            [
                ToolCall("memory_get", {"path": "memory/absent.md"}),
                ToolCall("ping", "{not json"),
                ToolCall("register_group", {"jid": "telegram:9", "name": "x", "folder": "x"}),
                ToolCall("ha_get_status", {}),
            ]
        ),
        Reply("The file is missing and I may not do the rest."),
    )
    code, result, stderr = run_agent(
        agent_input(groupFolder="field", isMain=False, chatJid=FIELD_JID),
        farm.agent_env("field", FARMAGENT_LLM_BASE_URL=llm_stub.base_url),
    )
    assert code == 0 and result["status"] == "ok" and result["toolCalls"] == 4, (result, stderr)
    first, second = llm_stub.requests
    assert "register_group" not in first.tool_names  # main-only tools are not offered to other groups
    results = [json.loads(m["content"]) for m in second.messages if m["role"] == "tool"]
    assert [r.get("errorCode") for r in results] == ["not_found", "invalid_request", "invalid_request", "unauthorized"]
    assert "memory/absent.md" in results[0]["error"]
    assert "not valid JSON" in results[1]["error"]
    assert "no tool 'register_group'" in results[2]["error"]
    assert "tool memory_get: error" in stderr  # the run log says what happened


def test_group_context_continues_and_isolated_does_not(farm: Farm, llm_stub: ScriptedLLM) -> None:
    def answer(request: Recorded) -> Reply:
        if request.messages[-1]["content"].endswith("The new tractor is blue."):
            return Reply("Noted: the new tractor is blue.")
        return Reply("It is blue." if "tractor is blue" in request.text() else "I do not know.")

    llm_stub.script(then=answer)
    env = farm.agent_env("field", FARMAGENT_LLM_BASE_URL=llm_stub.base_url)
    stored = farm.workspace("field") / ".farmagent" / "conversation.json"
    field = {"groupFolder": "field", "isMain": False, "chatJid": FIELD_JID}
    question = "What colour is the tractor?"

    assert run_agent(agent_input(**field, contextMode="group", prompt="The new tractor is blue."), env)[0] == 0
    with ThreadPoolExecutor(2) as pool:  # the isolated run must neither see nor touch the group's conversation
        grouped = pool.submit(run_agent, agent_input(**field, contextMode="group", prompt=question), env)
        isolated = pool.submit(run_agent, agent_input(**field, contextMode="isolated", prompt=question), env)
        assert grouped.result()[1]["answer"] == "It is blue."
        assert isolated.result()[1]["answer"] == "I do not know."

    first, *later = llm_stub.requests
    assert [m["role"] for m in first.messages] == ["system", "user"]
    (second,) = [r for r in later if len(r.messages) > 2]
    # The history as it was sent, the run section of its time ahead of the question: the second request begins
    # with the first's bytes (a server's prompt cache covers the whole earlier exchange), then this run's section.
    assert second.messages[:2] == first.messages
    assert second.messages[2] == {"role": "assistant", "content": "Noted: the new tractor is blue."}
    assert first.messages[1]["content"].startswith("## This run\nGroup 'field'")
    assert second.messages[-1]["role"] == "user" and second.messages[-1]["content"].endswith("\n" + question)
    assert second.messages[-1]["content"].startswith("## This run\n")
    kept = json.loads(stored.read_text())["messages"]
    assert [(m["role"], m["content"]) for m in kept] == [
        ("user", first.messages[1]["content"]),
        ("assistant", "Noted: the new tractor is blue."),
        ("user", second.messages[-1]["content"]),
        ("assistant", "It is blue."),
    ]


def test_scheduled_runs_and_the_proxy_socket(farm: Farm) -> None:
    # The host's proxy listens on a Unix socket; a short directory keeps the path under the 108-byte limit.
    with tempfile.TemporaryDirectory(prefix="fa-", dir="/tmp") as short:
        sock = Path(short) / "llm.sock"
        with ScriptedLLM([Reply("Checked the vents.")], unix_socket=sock) as llm:
            env = farm.agent_env(FARMAGENT_LLM_SOCKET=str(sock))
            inp = agent_input(scheduled=True, taskId="task-42", prompt="Check the greenhouse vents")
            code, result, stderr = run_agent(inp, env)
    assert (code, result["answer"]) == (0, "Checked the vents."), stderr
    (request,) = llm.requests
    assert request.headers["authorization"] == "Bearer farmhost-proxy"
    section = request.messages[-1]["content"]
    assert "scheduled run of task task-42" in section and "send_message" in section
    assert request.tool_names == [*DEFAULT_TOOLS, "find_tools", "use_tool"]
