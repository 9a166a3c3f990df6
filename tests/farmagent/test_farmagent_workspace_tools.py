"""memory_write and farm_state_read: the tools that work on the sandbox's own mounts, not through a request.

Path rules, links, size caps and atomicity on real files; the host's memory_search finding what memory_write
wrote through the real daemon; and the runner end to end with the scripted LLM.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_support import Farm, agent_input, offline_context, run_agent
from farmagent.config import AgentSettings
from farmagent.tools import ToolContext, ToolOutcome, call_tool
from farmagent.workspace import FARM_STATE_MISSING, MAX_FARM_STATE_BYTES, MAX_MEMORY_BYTES
from farmhost_testing import FIELD_JID
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall

WHITEFLY = "Whiteflies under the tomato leaves; yellow sticky traps helped within a week."


def call(context: ToolContext, name: str, **arguments: Any) -> tuple[ToolOutcome, Any]:
    outcome = call_tool(context, name, arguments)
    return outcome, json.loads(outcome.text)


def refused(context: ToolContext, name: str, code: str, **arguments: Any) -> str:
    outcome, document = call(context, name, **arguments)
    assert outcome.is_error and document["errorCode"] == code, document
    message: str = document["error"]
    return message


def tree(root: Path) -> dict[str, str | None]:
    """Every entry under `root` (links not followed): file contents, None for folders, '-> target' for links."""
    found: dict[str, str | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            found[rel] = None
        elif path.is_file():
            found[rel] = path.read_text(errors="replace")
        else:
            found[rel] = "special"
    return found


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return offline_context(tmp_path / "sandbox")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the workspace holding a file a link could aim at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.md").write_text("HA token: do-not-touch\n")
    return folder


# memory_write ------------------------------------------------------------------------------------------------


def test_append_creates_folders_and_adds_on_a_new_line(ctx: ToolContext) -> None:
    outcome, first = call(ctx, "memory_write", path="memory/crops/tomatoes.md", text="# Tomatoes\n\n- San Marzano")
    assert not outcome.is_error and first == {"path": "memory/crops/tomatoes.md", "bytes": 26, "lines": 3}
    target = ctx.group_dir / "memory" / "crops" / "tomatoes.md"
    target.write_bytes(target.read_bytes() + b"- Roma (no final newline)")
    _, second = call(ctx, "memory_write", path="memory/crops/tomatoes.md", text="- Cherry, in the greenhouse\n")
    assert target.read_text() == "# Tomatoes\n\n- San Marzano\n- Roma (no final newline)\n- Cherry, in the greenhouse\n"
    assert second == {"path": "memory/crops/tomatoes.md", "bytes": target.stat().st_size, "lines": 5}


def test_replace_rewrites_the_whole_file_and_leaves_no_temp_file(ctx: ToolContext) -> None:
    (ctx.group_dir / "MEMORY.md").write_text("old notes\n" * 50)
    inode = (ctx.group_dir / "MEMORY.md").stat().st_ino
    _, result = call(ctx, "memory_write", path="MEMORY.md", text="# Farm\nThe pump is a Grundfos SQ.", mode="replace")
    assert result == {"path": "MEMORY.md", "bytes": 34, "lines": 2}
    assert (ctx.group_dir / "MEMORY.md").read_text() == "# Farm\nThe pump is a Grundfos SQ.\n"
    assert (ctx.group_dir / "MEMORY.md").stat().st_ino != inode  # a new file renamed over the old one
    assert tree(ctx.group_dir) == {"MEMORY.md": "# Farm\nThe pump is a Grundfos SQ.\n"}


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("../MEMORY.md", "invalid_request"),
        ("memory/../../MEMORY.md", "invalid_request"),
        ("./MEMORY.md", "invalid_request"),
        ("memory//x.md", "invalid_request"),
        ("memory/x.md/", "invalid_request"),
        ("/workspace/group/MEMORY.md", "invalid_request"),
        ("memory\\x.md", "invalid_request"),
        ("memory/x.md\x00.txt", "invalid_request"),
        ("memory/a\nb.md", "invalid_request"),
        ("memory/%2e%2e/x.md", "invalid_request"),
        ("%4dEMORY.md", "invalid_request"),
        ("memory/\udc80.md", "invalid_request"),
        ("memory/" + "a" * 201 + ".md", "invalid_request"),
        ("memory/x.txt", "not_allowed"),
        ("memory/x.MD", "not_allowed"),
        ("memory", "not_allowed"),
        ("notes.md", "not_allowed"),
        ("Memory/x.md", "not_allowed"),
        ("~/MEMORY.md", "not_allowed"),
        ("logs/run.md", "not_allowed"),
        ("memory/.hidden.md", "not_allowed"),
        ("memory/.md", "not_allowed"),
        ("memory/.git/x.md", "not_allowed"),
        (".farmagent/conversation.md", "not_allowed"),
        ("memory/a/b/c/d/e/f/g/h.md", "not_allowed"),
    ],
)
@pytest.mark.parametrize("mode", ["append", "replace"])
def test_every_other_path_is_refused_and_nothing_is_created(ctx: ToolContext, path: str, code: str, mode: str) -> None:
    message = refused(ctx, "memory_write", code, path=path, text="planted", mode=mode)
    assert "path" in message or "memory_write writes only" in message
    assert tree(ctx.group_dir) == {}


@pytest.mark.parametrize("mode", ["append", "replace"])
def test_a_symlinked_memory_folder_is_refused_and_its_target_untouched(
    ctx: ToolContext, outside: Path, mode: str
) -> None:
    (ctx.group_dir / "memory").symlink_to(outside)
    message = refused(ctx, "memory_write", "not_allowed", path="memory/secret.md", text="planted", mode=mode)
    assert message == "'memory' is a symlink; memory_write never follows links"
    (ctx.group_dir / "memory").unlink()
    (ctx.group_dir / "memory").mkdir()
    (ctx.group_dir / "memory" / "sub").symlink_to(outside)  # a link deeper down
    message = refused(ctx, "memory_write", "not_allowed", path="memory/sub/new.md", text="planted", mode=mode)
    assert "'memory/sub' is a symlink" in message
    (ctx.group_dir / "memory" / "sub").unlink()
    (ctx.group_dir / "memory" / "sub").symlink_to(outside / "absent")  # dangling: must not be created through
    refused(ctx, "memory_write", "not_allowed", path="memory/sub/new.md", text="planted", mode=mode)
    assert tree(outside) == {"secret.md": "HA token: do-not-touch\n"}


@pytest.mark.parametrize("mode", ["append", "replace"])
@pytest.mark.parametrize("path", ["MEMORY.md", "memory/pump.md"])
def test_a_symlinked_memory_file_is_refused_and_its_target_untouched(
    ctx: ToolContext, outside: Path, mode: str, path: str
) -> None:
    link = ctx.group_dir / path
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(outside / "secret.md")
    message = refused(ctx, "memory_write", "not_allowed", path=path, text="planted", mode=mode)
    assert message == f"{path!r} is a symlink; memory_write never follows links"
    assert link.is_symlink() and tree(outside) == {"secret.md": "HA token: do-not-touch\n"}
    link.unlink()
    link.symlink_to(outside / "new.md")  # dangling: append's O_CREAT must not create the target
    refused(ctx, "memory_write", "not_allowed", path=path, text="planted", mode=mode)
    assert tree(outside) == {"secret.md": "HA token: do-not-touch\n"}


@pytest.mark.parametrize("mode", ["append", "replace"])
def test_hard_links_folders_and_fifos_are_not_memory_files(ctx: ToolContext, outside: Path, mode: str) -> None:
    memory = ctx.group_dir / "memory"
    memory.mkdir()
    os.link(outside / "secret.md", memory / "linked.md")
    (memory / "folder.md").mkdir()
    os.mkfifo(memory / "pipe.md")
    for name in ("linked.md", "folder.md", "pipe.md"):
        message = refused(ctx, "memory_write", "not_allowed", path=f"memory/{name}", text="planted", mode=mode)
        assert "not a regular file with a single link" in message or "cannot be opened safely" in message
    assert (outside / "secret.md").read_text() == "HA token: do-not-touch\n"
    assert os.listdir(memory / "folder.md") == []


def test_the_size_cap_refuses_without_writing(ctx: ToolContext) -> None:
    big = "é" * (MAX_MEMORY_BYTES // 2 + 1)  # within the schema's character limit, over the byte limit
    message = refused(ctx, "memory_write", "not_allowed", path="memory/big.md", text=big)
    assert f"over the {MAX_MEMORY_BYTES}-byte limit" in message and "nothing was written" in message
    assert tree(ctx.group_dir) == {}

    notes = ctx.group_dir / "memory" / "notes.md"
    _, full = call(ctx, "memory_write", path="memory/notes.md", text="x" * (MAX_MEMORY_BYTES - 11))
    assert full["bytes"] == MAX_MEMORY_BYTES - 10
    refused(ctx, "memory_write", "not_allowed", path="memory/notes.md", text="y" * 10)  # + newline: one byte over
    assert notes.stat().st_size == MAX_MEMORY_BYTES - 10
    _, exact = call(ctx, "memory_write", path="memory/notes.md", text="y" * 9)
    assert exact["bytes"] == MAX_MEMORY_BYTES == notes.stat().st_size


def test_a_refused_replace_leaves_the_old_file_intact(ctx: ToolContext) -> None:
    old = "# Farm\nThe well pump runs at 06:00.\n"
    (ctx.group_dir / "MEMORY.md").write_text(old)
    refused(
        ctx, "memory_write", "not_allowed", path="MEMORY.md", text="é" * (MAX_MEMORY_BYTES // 2 + 1), mode="replace"
    )
    refused(ctx, "memory_write", "invalid_request", path="MEMORY.md", text="half\x00written", mode="replace")
    refused(ctx, "memory_write", "invalid_request", path="MEMORY.md", text="lone \ud800 surrogate", mode="replace")
    refused(ctx, "memory_write", "invalid_request", path="MEMORY.md", text="x", mode="overwrite")
    assert tree(ctx.group_dir) == {"MEMORY.md": old}


def test_readers_see_the_old_file_or_the_new_one_never_a_part(ctx: ToolContext) -> None:
    versions = ["A" * 100_000 + "\n", "B" * 150_000 + "\n"]
    target = ctx.group_dir / "MEMORY.md"
    target.write_text(versions[0])
    seen: set[str] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(20):
            outcome, _ = call(ctx, "memory_write", path="MEMORY.md", text=versions[(i + 1) % 2], mode="replace")
            assert not outcome.is_error
    finally:
        done.set()
        reader.join()
    assert seen <= set(versions) and seen
    assert sorted(os.listdir(ctx.group_dir)) == ["MEMORY.md"]


def test_an_unusable_workspace_is_a_config_error(tmp_path: Path) -> None:
    context = offline_context(tmp_path)
    missing = ToolContext(client=context.client, group_dir=tmp_path / "nowhere", farm_state_dir=context.farm_state_dir)
    assert "FARMAGENT_GROUP_DIR" in refused(missing, "memory_write", "config_error", path="MEMORY.md", text="x")


# farm_state_read ---------------------------------------------------------------------------------------------


def test_farm_state_read_returns_the_hosts_json(ctx: ToolContext) -> None:
    current = {"generatedAt": "2026-11-30T10:54:17+01:00", "haConnected": True, "entities": {}, "alerts": []}
    (ctx.farm_state_dir / "current.json").write_text(json.dumps(current))
    (ctx.farm_state_dir / "calendar.json").write_text(json.dumps({"events": [{"summary": "Irrigate field 1"}]}))
    outcome, document = call(ctx, "farm_state_read", file="current")
    assert not outcome.is_error and document == current
    assert call(ctx, "farm_state_read", file="calendar")[1]["events"][0]["summary"] == "Irrigate field 1"


def test_farm_state_read_before_the_host_wrote_anything(ctx: ToolContext, tmp_path: Path) -> None:
    message = refused(ctx, "farm_state_read", "not_found", file="alerts")
    assert message.startswith(FARM_STATE_MISSING) and "alerts.json" in message
    gone = ToolContext(client=ctx.client, group_dir=ctx.group_dir, farm_state_dir=tmp_path / "absent")
    assert refused(gone, "farm_state_read", "not_found", file="current").startswith(FARM_STATE_MISSING)


def test_farm_state_read_refuses_links_odd_files_and_bad_names(ctx: ToolContext, outside: Path) -> None:
    (ctx.farm_state_dir / "current.json").symlink_to(outside / "secret.md")
    message = refused(ctx, "farm_state_read", "not_allowed", file="current")
    assert message == "'current.json' is a symlink; farm_state_read never follows links"
    (ctx.farm_state_dir / "devices.json").mkdir()
    assert "not a regular file" in refused(ctx, "farm_state_read", "not_allowed", file="devices")
    with open(ctx.farm_state_dir / "alerts.json", "wb") as sparse:
        sparse.truncate(MAX_FARM_STATE_BYTES + 1)
    assert "limit" in refused(ctx, "farm_state_read", "not_allowed", file="alerts")
    (ctx.farm_state_dir / "calendar.json").write_text('{"events": [')
    assert "not valid JSON" in refused(ctx, "farm_state_read", "protocol_error", file="calendar")
    for name in ("telemetry", "../current", "current.json"):
        refused(ctx, "farm_state_read", "invalid_request", file=name)
    assert tree(outside) == {"secret.md": "HA token: do-not-touch\n"}


def test_the_farm_state_dir_is_a_setting() -> None:
    assert AgentSettings.from_env({}).farm_state_dir == Path("/workspace/farm-state")
    assert AgentSettings.from_env({"FARMAGENT_FARM_STATE_DIR": "/x/fs"}).farm_state_dir == Path("/x/fs")


# Through the real daemon -------------------------------------------------------------------------------------


def test_the_hosts_memory_search_sees_each_write(farm: Farm) -> None:
    context = farm.context("field")
    pests = farm.workspace("field") / "memory" / "pests.md"
    call(context, "memory_write", path="memory/pests.md", text="# Pests\n\nAphids on field 3 in June.", mode="replace")
    hits = context.client.memory_search("aphids", top_k=1)["hits"]
    assert hits[0]["citation"] == "memory/pests.md#L1-L3" and hits[0]["groupFolder"] == "field"

    _, result = call(context, "memory_write", path="memory/pests.md", text=f"## Greenhouse\n\n{WHITEFLY}")
    assert result == {"path": "memory/pests.md", "bytes": pests.stat().st_size, "lines": 6}
    (hit, *_) = context.client.memory_search("whiteflies sticky traps", top_k=3)["hits"]
    assert hit["citation"] == "memory/pests.md#L4-L6" and WHITEFLY in hit["snippet"]
    assert context.client.memory_get("memory/pests.md", from_line=6, lines=1)["text"] == WHITEFLY


def test_the_runner_remembers_with_memory_write_and_finds_it_next_run(farm: Farm, llm_stub: ScriptedLLM) -> None:
    def after_search(request: Recorded) -> Reply:
        hits = json.loads(request.last_tool_result() or "{}").get("hits", [])
        found = [h for h in hits if "Kubota" in h["snippet"]]
        return Reply(f"The tractor is the Kubota [field:{found[0]['citation']}]." if found else f"Not found: {hits}")

    llm_stub.script(
        ToolCall(
            "memory_write", {"path": "memory/machines.md", "text": "- 2026-07-01: the new tractor is a Kubota M5."}
        ),
        Reply("Noted."),
        ToolCall("memory_search", {"query": "which tractor"}),
        after_search,
    )
    env = farm.agent_env("field", FARMAGENT_LLM_BASE_URL=llm_stub.base_url)
    field = {"groupFolder": "field", "isMain": False, "chatJid": FIELD_JID}
    code, result, stderr = run_agent(agent_input(**field, prompt="Remember: the new tractor is a Kubota M5."), env)
    assert (code, result["answer"]) == (0, "Noted."), stderr
    code, result, stderr = run_agent(agent_input(**field, runId="run-2", prompt="Which tractor do we have?"), env)
    assert (code, result["answer"]) == (0, "The tractor is the Kubota [field:memory/machines.md#L1-L1]."), stderr

    first, second, third, _ = llm_stub.requests
    assert {"memory_write", "farm_state_read"} <= set(first.tool_names)
    assert "memory_write" in first.system and "farm_state_read" in first.system
    machines = farm.workspace("field") / "memory" / "machines.md"
    assert json.loads(second.last_tool_result() or "{}") == {"path": "memory/machines.md", "bytes": 46, "lines": 1}
    assert machines.read_text() == "- 2026-07-01: the new tractor is a Kubota M5.\n"
    assert "Kubota" not in third.system  # not in MEMORY.md's head: only the search can find it
