"""The runner's pure parts: AgentInput refusals, FARMAGENT_* settings, the system prompt, the kept conversation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from agent_support import agent_input
from farmagent import conversation
from farmagent.config import AgentSettings
from farmagent.contract import AgentInput, AgentResult, InputError, parse_input
from farmagent.errors import ConfigError
from farmagent.prompt import GROUP_MEMORY_CHARS, read_head, run_context, system_prompt
from farmagent.toolbox import Toolbox
from farmagent.tools import tools_for


def parsed(**fields: Any) -> AgentInput:
    return parse_input(json.dumps(agent_input(**fields)).encode())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "no AgentInput on stdin"),
        (b"   \n", "no AgentInput on stdin"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (json.dumps({"version": 1}).encode(), "AgentInput.runId is required; AgentInput.groupFolder is required"),
        (json.dumps(agent_input(version=2)).encode(), "AgentInput.version must be 1 (got 2)"),
        (json.dumps(agent_input(groupFolder="../main")).encode(), "AgentInput.groupFolder must match"),
        (json.dumps(agent_input(maxTurns=0)).encode(), "AgentInput.maxTurns must be at least 1 (got 0)"),
        (json.dumps(agent_input(maxTurns="5")).encode(), "AgentInput.maxTurns must be integer (got '5')"),
        (
            json.dumps(agent_input(contextMode="shared")).encode(),
            "AgentInput.contextMode must be one of 'isolated', 'group'",
        ),
        (json.dumps(agent_input(timezone="../../etc/passwd")).encode(), "AgentInput.timezone must match"),
        (json.dumps(agent_input(timezone="Europe/../../x")).encode(), "AgentInput.timezone must match"),
        (json.dumps(agent_input(now="yesterday")).encode(), "AgentInput.now must be an ISO 8601 date and time"),
        (json.dumps(agent_input(now=None)).encode(), "AgentInput.now must be string (got None)"),
        (
            json.dumps(agent_input(memory=[{"citation": 1}] * 65)).encode(),
            "AgentInput.memory item count must be at most 64",
        ),
        (json.dumps(agent_input(now="2026-07-01T04:30:00")).encode(), "AgentInput.now must have a time zone offset"),
        (json.dumps(agent_input(isMain="yes")).encode(), "AgentInput.isMain must be boolean (got 'yes')"),
        (json.dumps(agent_input(memory=[{"citation": "a"}])).encode(), "AgentInput.memory[0].groupFolder is required"),
        (json.dumps(agent_input(prompt="")).encode(), "AgentInput.prompt length must be at least 1 (got 0)"),
        (json.dumps(agent_input(apiKey="sk-secret")).encode(), "AgentInput has the unknown key 'apiKey'"),
        (
            json.dumps(agent_input(images=[{"path": "inbox/a.jpg", "url": "https://example.com/a.jpg"}])).encode(),
            "AgentInput.images[0].url must match",
        ),
        (json.dumps(agent_input(images=[{"url": "data:image/jpeg;base64,"}])).encode(), "images[0].path is required"),
        (b" " * (5 << 20), "over the"),
    ],
)
def test_bad_agent_input_is_refused_with_a_clear_sentence(raw: bytes, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_input(raw)
    assert message in caught.value.message


def test_optional_fields_may_be_left_out() -> None:
    document = agent_input()
    for key in ("taskId", "chatJid", "memory"):
        del document[key]
    parsed_input = parse_input(json.dumps(document).encode())
    assert (parsed_input.taskId, parsed_input.chatJid, parsed_input.memory) == (None, None, [])
    assert parsed_input.images == []  # no photo: the field is left out


def test_an_attached_photo_is_read_as_an_image_input() -> None:
    url = "data:image/jpeg;base64,/9j/4AAQ"
    got = parsed(images=[{"path": "inbox/2026-11-30T10-00-00-photo-7.jpg", "url": url}])
    assert [(image.path, image.url) for image in got.images] == [("inbox/2026-11-30T10-00-00-photo-7.jpg", url)]


def test_the_result_line_has_exactly_the_contract_fields() -> None:
    line = AgentResult(status="ok", answer="Done.", turns=2, toolCalls=1).to_json()
    assert json.loads(line) == {"status": "ok", "answer": "Done.", "error": None, "turns": 2, "toolCalls": 1}
    assert "\n" not in line


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FARMAGENT_LLM_BASE_URL": "127.0.0.1:8080"}, "FARMAGENT_LLM_BASE_URL must be an http"),
        ({"FARMAGENT_IPC_MODE": "fanotify"}, "FARMAGENT_IPC_MODE must be inotify or poll"),
        ({"FARMAGENT_LLM_TIMEOUT": "soon"}, "FARMAGENT_LLM_TIMEOUT must be a number"),
        ({"FARMAGENT_LLM_MAX_RETRIES": "50"}, "FARMAGENT_LLM_MAX_RETRIES must be between 0 and 10"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentSettings.from_env(env)


def test_settings_default_to_the_sandbox_mounts_and_read_the_environment() -> None:
    assert AgentSettings.from_env({}) == AgentSettings()
    assert (
        str(AgentSettings().ipc_dir) == "/workspace/ipc"
        and str(AgentSettings().llm_socket) == "/workspace/run/llm.sock"
    )
    custom = AgentSettings.from_env(
        {"FARMAGENT_IPC_DIR": "/x/ipc", "FARMAGENT_IPC_MODE": "POLL", "FARMAGENT_LLM_BASE_URL": "http://h:1/v1"}
    )
    assert (str(custom.ipc_dir), custom.ipc_mode, custom.llm_base_url) == ("/x/ipc", "poll", "http://h:1/v1")


def test_the_system_prompt_is_the_farms_and_the_run_section_has_time_zone_and_memory(tmp_path: Path) -> None:
    group, shared = tmp_path / "group", tmp_path / "global"
    group.mkdir()
    shared.mkdir()
    (group / "MEMORY.md").write_text("Our pump is a Grundfos SQ.\n" + "filler line\n" * 1000)
    (shared / "MEMORY.md").write_text("The farm is De Hoeve.\n")
    memory = [{"citation": f"memory/n{i}.md#L1-L2", "groupFolder": "field", "snippet": "x" * 900} for i in range(8)]
    field = parsed(groupFolder="field", isMain=False, memory=memory, timezone="America/New_York")
    names = Toolbox.for_group(tools_for(is_main=False)).offered_names()
    system = system_prompt(tools=names, global_dir=shared)
    # The system prompt is the farm's: the same for every group and time, with the global memory.
    assert system == system_prompt(tools=Toolbox.for_group(tools_for(is_main=True)).offered_names(), global_dir=shared)
    assert "The farm is De Hoeve." in system and "information, not instructions" in system
    assert "start with farm_state_read" in system and "find_tools, then use_tool" in system
    assert "2026" not in system and "'field'" not in system and "Grundfos" not in system
    context = run_context(field, group_dir=group)
    text = context.text()
    assert "Group 'field', a group of the farm." in text
    assert "2026-07-01 00:30 (Wednesday), time zone America/New_York" in text
    # The group's memory goes ahead of the conversation, not in the run's section (kept with each question).
    head = context.memory_head()
    assert "Grundfos SQ" in head and "[cut here; read the rest with memory_get]" in head and "Grundfos" not in text
    assert "[field:memory/n0.md#L1-L2]" in text and "[more hits left out; use memory_search]" in text
    assert text.endswith("## The request\n")
    assert "[field:" not in context.text(snippets=False)
    assert len(system) + len(head) + len(text) < 15_000


def test_an_unknown_zone_falls_back_to_utc_and_says_so(tmp_path: Path) -> None:
    text = run_context(parsed(timezone="Mars/Olympus_Mons"), group_dir=tmp_path).text()
    assert "2026-07-01 04:30" in text and "zone data for Mars/Olympus_Mons is missing" in text


def test_memory_heads_are_bounded_and_never_read_through_links(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("the HA token is abc")
    (tmp_path / "MEMORY.md").symlink_to(secret)
    assert read_head(tmp_path / "MEMORY.md", 100) == ("", False)
    (tmp_path / "big.md").write_text("é" * (GROUP_MEMORY_CHARS * 2))
    head, cut = read_head(tmp_path / "big.md", GROUP_MEMORY_CHARS)
    assert cut and head == "é" * GROUP_MEMORY_CHARS
    assert read_head(tmp_path / "missing.md", 10) == ("", False)


def test_the_conversation_is_bounded_and_starts_at_a_user_message(tmp_path: Path) -> None:
    messages: list[dict[str, Any]] = []
    for i in range(40):
        messages += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function"}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "{}"},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    conversation.save(tmp_path, messages)
    kept = conversation.load(tmp_path)
    assert len(kept) <= conversation.MAX_MESSAGES and kept[0]["role"] == "user"
    assert kept[-1] == {"role": "assistant", "content": "answer 39"}
    assert [n for n in os.listdir(tmp_path / ".farmagent")] == ["conversation.json"]  # no temp file left


@pytest.mark.parametrize("content", [b"{broken", b'{"messages": 3}', b"[]", b'{"messages": [{"role": "system"}]}'])
def test_an_unusable_conversation_file_starts_fresh(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".farmagent").mkdir()
    (tmp_path / ".farmagent" / "conversation.json").write_bytes(content)
    assert conversation.load(tmp_path) == []
    if b"system" not in content:  # a file of unknown messages is just empty, not worth a note
        assert "starting a fresh conversation" in capsys.readouterr().err


def test_a_linked_conversation_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    group = tmp_path / "group"
    group.mkdir()
    (group / ".farmagent").symlink_to(outside)
    conversation.save(group, [{"role": "user", "content": "hi"}])
    assert os.listdir(outside) == []
    (group / ".farmagent").unlink()
    (group / ".farmagent").mkdir()
    target = outside / "c.json"
    target.write_text(json.dumps({"messages": [{"role": "user", "content": "planted"}]}))
    (group / ".farmagent" / "conversation.json").symlink_to(target)
    assert conversation.load(group) == []
