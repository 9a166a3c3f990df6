"""The MCP server over stdio, driven by a real MCP client session against the real daemon."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from agent_support import Farm
from farmagent.tools import TOOLS
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent


@asynccontextmanager
async def session(env: dict[str, str], errlog: Path) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session with `python -m farmagent.mcp_server` in `env`."""
    server = StdioServerParameters(command=sys.executable, args=["-m", "farmagent.mcp_server"], env=env)
    with errlog.open("w") as log:
        async with stdio_client(server, errlog=log) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            yield client


def text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


async def test_mcp_lists_every_tool_and_answers_with_the_daemon(farm: Farm, tmp_path: Path) -> None:
    async with session(farm.agent_env("main"), tmp_path / "mcp.log") as client:
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

        refused = await client.call_tool("ha_get_status", {})
        assert refused.is_error and json.loads(text(refused))["errorCode"] == "unauthorized"

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
