"""The MCP server over stdio, driven by a real MCP client session against the real daemon."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import jsonschema
from agent_support import Farm, clean_env, fake_ipc_dir
from farmagent.tools import TOOLS, TOOLS_BY_NAME

if TYPE_CHECKING:
    # Imported where used: every xdist worker collects this module, and the MCP SDK costs ~0.9 s to import.
    from mcp import ClientSession
    from mcp.types import CallToolResult

MAIN_ONLY = {"list_groups", "refresh_groups", "register_group"}
FARM_ACTIONS = {tool.name for tool in TOOLS if tool.name.startswith("ha_")} | {"farm_state_refresh"}


@asynccontextmanager
async def session(env: dict[str, str], errlog: Path, *args: str) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session with `python -m farmagent.mcp_server *args` in `env`."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    server = StdioServerParameters(command=sys.executable, args=["-m", "farmagent.mcp_server", *args], env=env)
    with errlog.open("w") as log:
        async with stdio_client(server, errlog=log) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            yield client


def text(result: CallToolResult) -> str:
    from mcp.types import TextContent

    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


def main_env(farm: Farm) -> dict[str, str]:
    """The environment the host gives main's sandbox: the dashboards are mounted (and named) for main only."""
    return farm.agent_env("main", FARMAGENT_DASHBOARD_DIR=str(farm.data_dir / "dashboards"))


async def test_mcp_lists_every_tool_and_answers_with_the_daemon(farm: Farm, tmp_path: Path) -> None:
    async with session(main_env(farm), tmp_path / "mcp.log") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == {tool.name for tool in TOOLS}
        for spec in TOOLS:
            assert listed[spec.name].description == spec.description
            assert listed[spec.name].input_schema == spec.parameters

        pong = await client.call_tool("ping", {})
        assert not pong.is_error and json.loads(text(pong))["pong"] is True

        found = await client.call_tool("memory_search", {"query": "tomatoes", "topK": 3})
        hits = json.loads(text(found))["hits"]
        assert not found.is_error and "San Marzano" in hits[0]["snippet"]

        task = await client.call_tool(
            "schedule_task", {"prompt": "Water field 2", "schedule_type": "interval", "schedule_value": "600000"}
        )
        task_id = json.loads(text(task))["taskId"]
        listing = json.loads(text(await client.call_tool("list_tasks", {})))
        assert task_id in {t["id"] for t in listing["tasks"]}


async def test_mcp_errors_are_tool_errors_with_the_code(farm: Farm, tmp_path: Path) -> None:
    async with session(farm.agent_env("field"), tmp_path / "mcp.log") as client:
        missing = await client.call_tool("memory_get", {"path": "memory/nothing.md"})
        assert missing.is_error
        assert json.loads(text(missing))["errorCode"] == "not_found" and "memory/nothing.md" in text(missing)

        hidden = await client.call_tool("ha_get_status", {})
        assert hidden.is_error and json.loads(text(hidden))["errorCode"] == "invalid_request"
        assert "there is no tool 'ha_get_status' here" in text(hidden)

        bad = await client.call_tool("memory_search", {"query": 7})
        assert bad.is_error and "arguments.query must be string" in text(bad)

        # The session survives errors: the next call still works.
        assert json.loads(text(await client.call_tool("ping", {})))["pong"] is True


async def test_mcp_serves_the_workspace_tools_on_the_sandbox_mounts(farm: Farm, tmp_path: Path) -> None:
    async with session(farm.agent_env("field"), tmp_path / "mcp.log") as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert {"memory_write", "farm_state_read"} <= listed

        written = await client.call_tool("memory_write", {"path": "memory/mcp.md", "text": "Written over MCP."})
        assert not written.is_error and json.loads(text(written)) == {"path": "memory/mcp.md", "bytes": 18, "lines": 1}
        assert (farm.workspace("field") / "memory" / "mcp.md").read_text() == "Written over MCP.\n"

        missing = await client.call_tool("farm_state_read", {"file": "alerts"})
        assert missing.is_error and json.loads(text(missing))["errorCode"] == "not_found"


async def test_mcp_offers_main_its_tools_and_other_groups_only_theirs(farm: Farm, tmp_path: Path) -> None:
    async with session(main_env(farm), tmp_path / "main.log") as client:
        main_tools = {tool.name for tool in (await client.list_tools()).tools}
    async with session(farm.agent_env("field"), tmp_path / "field.log") as client:
        field_tools = {tool.name for tool in (await client.list_tools()).tools}
    async with session(farm.agent_env("field"), tmp_path / "all.log", "--all-tools") as client:
        opened = {tool.name for tool in (await client.list_tools()).tools}
        # Offering is not allowing: the host still refuses a farm action outside main.
        refused = await client.call_tool("ha_get_status", {})
        assert refused.is_error and json.loads(text(refused))["errorCode"] == "unauthorized"

    assert main_tools == opened == set(TOOLS_BY_NAME)
    assert field_tools == set(TOOLS_BY_NAME) - MAIN_ONLY - FARM_ACTIONS
    assert {"send_message", "memory_search", "memory_write", "schedule_task", "ping"} <= field_tools


async def test_mcp_tools_have_annotations_described_parameters_and_output_schemas(farm: Farm, tmp_path: Path) -> None:
    async with session(main_env(farm), tmp_path / "mcp.log") as client:
        listed = (await client.list_tools()).tools
    assert len(listed) == len(TOOLS)
    for tool in listed:
        hints = tool.annotations
        assert hints is not None, tool.name
        assert hints.read_only_hint is not None and hints.destructive_hint is not None
        assert hints.idempotent_hint is not None and hints.open_world_hint is not None
        for name, schema in tool.input_schema["properties"].items():
            assert schema.get("description"), f"{tool.name}.{name} has no description"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
        jsonschema.Draft202012Validator.check_schema(tool.output_schema)
    by_name = {tool.name: tool.annotations for tool in listed}
    assert by_name["memory_search"].read_only_hint is True  # type: ignore[union-attr]
    assert by_name["ha_restart"].destructive_hint is True  # type: ignore[union-attr]
    assert by_name["ha_restart"].open_world_hint is True  # type: ignore[union-attr]
    assert by_name["memory_write"].read_only_hint is False  # type: ignore[union-attr]


async def test_mcp_structured_content_matches_the_output_schema(farm: Farm, tmp_path: Path) -> None:
    async with session(main_env(farm), tmp_path / "mcp.log") as client:
        schemas = {tool.name: tool.output_schema for tool in (await client.list_tools()).tools}
        calls = {
            "ping": {},
            "memory_search": {"query": "tomatoes"},
            "memory_get": {"path": "MEMORY.md"},
            "memory_write": {"path": "memory/structured.md", "text": "Checked."},
            "list_tasks": {},
            "list_groups": {},
            "schedule_task": {"prompt": "Check the well", "schedule_type": "cron", "schedule_value": "0 6 * * *"},
        }
        for name, arguments in calls.items():
            result = await client.call_tool(name, arguments)
            assert not result.is_error, text(result)
            assert result.structured_content == json.loads(text(result)), name
            jsonschema.validate(result.structured_content, schemas[name])  # type: ignore[arg-type]
        assert result.structured_content is not None and result.structured_content["taskId"]

        failed = await client.call_tool("memory_get", {"path": "memory/absent.md"})
        assert failed.is_error and failed.structured_content is None


async def test_mcp_sends_progress_while_the_host_is_slow(tmp_path: Path) -> None:
    # This test plays the host: it answers the request only after the client has seen progress.
    ipc = fake_ipc_dir(tmp_path / "ipc")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FARMAGENT_")},
        "FARMAGENT_IPC_DIR": str(ipc),
        "FARMAGENT_GROUP_DIR": str(tmp_path),
        "FARMAGENT_FARM_STATE_DIR": str(tmp_path),
        "FARMAGENT_DASHBOARD_DIR": str(tmp_path),
    }
    progressed = anyio.Event()
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))
        progressed.set()

    async def host() -> str:
        actions = ipc / "actions"
        while not (requests := [n for n in os.listdir(actions) if n.endswith(".json")]):
            await anyio.sleep(0.02)
        request = json.loads((actions / requests[0]).read_text())
        await progressed.wait()
        result = {
            "requestId": request["requestId"],
            "type": "farm_action",
            "action": "ha_restart",
            "status": "success",
            "result": {"restarted": True},
            "error": None,
            "errorCode": None,
            "executedAt": "2026-05-17T00:00:10.123Z",
            "durationMs": 4000,
        }
        tmp = ipc / "action_results" / f".{request['requestId']}.tmp"
        tmp.write_text(json.dumps(result))
        os.rename(tmp, ipc / "action_results" / f"{request['requestId']}.json")
        return str(request["action"])

    async with session(env, tmp_path / "mcp.log") as client, anyio.create_task_group() as tasks:
        answered: list[str] = []

        async def answer() -> None:
            answered.append(await host())

        tasks.start_soon(answer)
        restarted = await client.call_tool("ha_restart", {}, progress_callback=on_progress)

    assert answered == ["ha_restart"]
    assert not restarted.is_error and restarted.structured_content == {"restarted": True}
    assert seen and seen[0][0] > 0 and "waiting for the host" in (seen[0][1] or "")
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)


def test_mcp_help_explains_and_exits_without_serving() -> None:
    # stdin stays open: a server would wait on it and the call would time out instead of exiting.
    with subprocess.Popen(
        [sys.executable, "-m", "farmagent.mcp_server", "--help"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.wait(timeout=8) == 0, proc.stderr.read()
        out = proc.stdout.read()
    assert out.startswith("usage: farmagent-mcp") and "FARMAGENT_IPC_DIR" in out and "--all-tools" in out

    version = subprocess.run(
        [sys.executable, "-m", "farmagent.mcp_server", "--version"], capture_output=True, text=True, check=False
    )
    assert version.returncode == 0 and version.stdout.startswith("farmagent-mcp ")


def readme_snippets() -> tuple[dict[str, Any], dict[str, Any], str]:
    """The OpenCode and Claude Code JSON and the Inspector command line of the README's MCP section."""
    readme = (Path(__file__).parents[2] / "container" / "README.md").read_text()
    section = readme[readme.index("## The MCP server") : readme.index("## The runner contract")]
    blocks = re.findall(r"```(json|sh)\n(.*?)```", section, re.DOTALL)
    (opencode, claude), (inspector,) = (
        [json.loads(b) for k, b in blocks if k == "json"],
        [b for k, b in blocks if k == "sh"],
    )
    return opencode, claude, inspector


def in_checkout(farm: Farm, env: dict[str, str], command: list[str]) -> tuple[list[str], dict[str, str]]:
    """A snippet's command and environment with the image's paths replaced by this checkout's and the farm's."""
    mounts = {
        "/workspace/ipc": farm.ipc("main"),
        "/workspace/group": farm.workspace("main"),
        "/workspace/farm-state": farm.farm_state(),
        "/workspace/dashboard": farm.data_dir / "dashboards",
    }
    local = {name: str(mounts[value]) for name, value in env.items()}
    image_bin = "/usr/local/bin/"
    assert command[0].startswith(image_bin), command
    binary = Path(sys.executable).parent / command[0].removeprefix(image_bin)
    return [str(binary), *command[1:]], {**farm.agent_env("main"), **local}


async def test_the_readme_mcp_configurations_start_the_server(farm: Farm, tmp_path: Path) -> None:
    opencode, claude, inspector = readme_snippets()
    local = opencode["mcp"]["farm"]
    stdio = claude["mcpServers"]["farm"]
    assert local["type"] == "local" and stdio["type"] == "stdio"
    assert local["command"] == [stdio["command"], *stdio["args"]]
    assert local["environment"] == stdio["env"]
    # Every setting a tool reads, and the Inspector line passes the same ones to the same command.
    assert {"FARMAGENT_IPC_DIR", "FARMAGENT_GROUP_DIR", "FARMAGENT_FARM_STATE_DIR"} <= set(stdio["env"])
    words = inspector.replace("\\\n", " ").split()
    assert words[:3] == ["npx", "@modelcontextprotocol/inspector", "--cli"] and stdio["command"] in words
    assert {f"{k}={v}" for k, v in stdio["env"].items()} == {words[i + 1] for i, w in enumerate(words) if w == "-e"}

    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    for command, env in (local["command"], local["environment"]), ([stdio["command"]], stdio["env"]):
        argv, full_env = in_checkout(farm, env, command)
        server = StdioServerParameters(command=argv[0], args=argv[1:], env=full_env)
        with (tmp_path / "snippet.log").open("w") as log:
            async with stdio_client(server, errlog=log) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                assert {tool.name for tool in (await client.list_tools()).tools} == set(TOOLS_BY_NAME)
                pong = await client.call_tool("ping", {})
                assert not pong.is_error and pong.structured_content is not None
                assert pong.structured_content["pong"] is True


def _lines(*messages: dict[str, Any]) -> bytes:
    """The messages as the wire carries them: one JSON document a line."""
    return b"".join(json.dumps(message).encode() + b"\n" for message in messages)


def test_mcp_answers_requests_written_at_the_spawn_once_each(tmp_path: Path) -> None:
    # Everything written at once, while the server still imports the SDK: each request gets one answer.
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    wire = _lines(
        {"jsonrpc": "2.0", "id": "i", "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        listing,
        {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "ping", "arguments": {}}},
        listing | {"id": 4},
    )
    ipc = tmp_path / "ipc"
    for queue in ("messages", "tasks", "actions", "action_results"):
        (ipc / queue).mkdir(parents=True)
    env = {k: v for k, v in clean_env().items() if not k.startswith("FARMAGENT_")}
    env |= {"FARMAGENT_IPC_DIR": str(ipc), "FARMAGENT_GROUP_DIR": str(ipc), "FARMAGENT_FARM_STATE_DIR": str(ipc)}
    with subprocess.Popen(
        [sys.executable, "-m", "farmagent.mcp_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as server:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(wire)
        server.stdin.flush()
        answers: dict[Any, dict[str, Any]] = {}
        while len(answers) < 4:
            line = server.stdout.readline()
            assert line, f"the server closed stdout after {answers}"
            message = json.loads(line)
            if "id" in message:
                answers[message["id"]] = message
        server.stdin.close()
        assert server.stdout.read() == b"", "an answer came twice"
        assert server.wait(timeout=10) == 0
    assert set(answers) == {"i", 2, "c", 4}
    assert answers[2]["result"] == answers[4]["result"] and answers[2]["result"]["tools"]
    # No host ever served this directory: the call is a tool error the model can read, not a broken session.
    assert answers["c"]["result"]["isError"] is True
    assert json.loads(answers["c"]["result"]["content"][0]["text"])["errorCode"] == "host_unavailable"
