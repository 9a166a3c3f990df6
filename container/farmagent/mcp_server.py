"""The farm tools as an MCP server over stdio, for any MCP-capable agent (Claude Code, OpenCode, ...).

Owns the MCP side of `farmagent.tools.TOOLS`: which tools a group is offered, their annotations and output
schemas, progress notifications while a call waits for the host, and the `farmagent-mcp` command line.
Run `farmagent-mcp` or `python -m farmagent.mcp_server`; it is configured by the FARMAGENT_* variables (see
`farmagent.config`). A call returns the operation's result as JSON text and as `structuredContent`, or an MCP
tool error (`isError`) whose text is `{"errorCode": ..., "error": ...}`.

The MCP SDK is imported only once the command line has been parsed: `--help` and `--version` answer at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from farmagent import __version__
from farmagent.config import AgentSettings
from farmagent.errors import ConfigError
from farmagent.mcp_stdio import Wire, claim_stdio, piped_stdio
from farmagent.tools import Hints, ToolContext, ToolSpec, call_tool, tools_for

if TYPE_CHECKING:
    from mcp import types
    from mcp.server import Server, ServerRequestContext

INSTRUCTIONS: Final = (
    "Tools of a farm-agent appliance. You run in a sandbox with no network: everything outside your workspace "
    "(chat messages, scheduled tasks, memory search, Home Assistant) goes through these tools, and the host "
    "decides. A tool error's text is JSON with errorCode and error; read the error and adapt."
)
# OpenCode gives up on a tool after 5 s and the TypeScript SDK after 60 s unless progress resets the clock;
# ha_restart waits minutes. Every 2 s keeps both waiting at the cost of a few bytes.
PROGRESS_INTERVAL: Final = 2.0
# Tool calls that wait for the host at once (each in a thread); further calls queue. anyio's default was 40.
MAX_CONCURRENT_CALLS: Final = 40
_DESCRIPTION: Final = (
    "Serve farmhost's IPC requests (messages, tasks, memory, Home Assistant actions) as MCP tools over stdio. "
    "Each call writes a request file into the group's IPC directory and waits for the host's result."
)
_EPILOG: Final = """environment:
  FARMAGENT_IPC_DIR         the group's IPC directory (default /workspace/ipc)
  FARMAGENT_GROUP_DIR       the group's workspace, for memory_write (default /workspace/group)
  FARMAGENT_FARM_STATE_DIR  the host's farm-state files, for farm_state_read (default /workspace/farm-state)
  FARMAGENT_DASHBOARD_DIR   set by the host for the main group only: main's tools are offered
  FARMAGENT_IPC_MODE        inotify (default) or poll

A group other than main is offered neither the main-only tools nor the farm actions (ha_*,
farm_state_refresh); --all-tools offers them too, for a farm profile that opens actions to the group.
The host decides every request either way."""


def offered_tools(settings: AgentSettings, *, all_tools: bool = False) -> tuple[ToolSpec, ...]:
    """The tools this group is offered: everything for main, or with `all_tools`; the group's own tools else."""
    if all_tools:
        return tools_for(is_main=True)
    return tools_for(is_main=settings.is_main, farm_actions=False)


def output_schema(tool: ToolSpec) -> dict[str, Any]:
    """The tool's `outputSchema`: the object a successful call returns (a tool error carries only its text)."""
    return {**tool.result, "description": f"The result of {tool.name}."}


def structured(value: Any) -> dict[str, Any]:
    """`structuredContent` of a result: the object itself; anything else (a farm-state list) as `{"value": ...}`."""
    return value if isinstance(value, dict) else {"value": value}


def build_server(context: ToolContext, tools: Sequence[ToolSpec]) -> Server[Any]:
    """An MCP server offering `tools`, run with `context`."""
    from mcp import types
    from mcp.server import Server

    workers = ThreadPoolExecutor(max_workers=MAX_CONCURRENT_CALLS, thread_name_prefix="farmagent-tool")
    offered = {tool.name: tool for tool in tools}
    listing = types.ListToolsResult(tools=[types.Tool.model_validate(tool_listing(tool)) for tool in tools])

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    async def run_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in offered:
            refusal = f"there is no tool {params.name!r} here; tools: {', '.join(offered)}"
            text = json.dumps({"errorCode": "invalid_request", "error": refusal})
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
        # The tools block on files; a worker thread keeps the server answering other calls meanwhile. Plain
        # asyncio (anyio runs on it) costs less per call than anyio.to_thread plus a task group for the beat.
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(workers, call_tool, context, params.name, params.arguments)
        started = time.monotonic()
        while not (await asyncio.wait((running,), timeout=PROGRESS_INTERVAL))[0]:
            waited = time.monotonic() - started
            # A no-op unless the client sent a progressToken with the call.
            await ctx.session.report_progress(waited, None, f"waiting for the host: {waited:.0f} s")
        outcome = running.result()
        return types.CallToolResult(
            content=[types.TextContent(text=outcome.text)],
            structured_content=None if outcome.is_error else structured(outcome.value),
            is_error=outcome.is_error,
        )

    server: Server[Any] = Server(
        "farmagent",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=run_tool,
    )
    # The SDK wraps every request in an OpenTelemetry span by default; the sandbox has no collector to send
    # spans to, and the span costs a tenth of a tool call's time in the server.
    server.middleware = []
    return server


def tool_listing(tool: ToolSpec) -> dict[str, Any]:
    """The tool as `tools/list` lists it (MCP's `Tool` in its wire form)."""
    hints: Hints = tool.hints
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.parameters,
        "outputSchema": output_schema(tool),
        "annotations": {
            "title": tool.name.replace("_", " "),
            "readOnlyHint": hints.read_only,
            "destructiveHint": hints.destructive,
            "idempotentHint": hints.idempotent,
            "openWorldHint": hints.open_world,
        },
    }


async def serve(context: ToolContext, tools: Sequence[ToolSpec], wire: Wire | None = None) -> None:
    """Serve `tools` on stdin/stdout (on `wire` when claimed) until the client closes the connection."""
    from mcp.server.stdio import stdio_server

    server = build_server(context, tools)
    options = server.create_initialization_options()
    if wire is None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, options)
        return
    async with piped_stdio(wire) as streams, stdio_server(*streams) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


def parser() -> argparse.ArgumentParser:
    """The command line of `farmagent-mcp`."""
    cli = argparse.ArgumentParser(
        prog="farmagent-mcp",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    cli.add_argument(
        "--all-tools", action="store_true", help="offer every tool, whatever the group (the host still decides)"
    )
    return cli


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `farmagent-mcp`: parse the command line, read FARMAGENT_* and serve over stdio."""
    args = parser().parse_args(argv)
    try:
        settings = AgentSettings.from_env()
    except ConfigError as err:
        print(f"farmagent-mcp: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    tools = offered_tools(settings, all_tools=args.all_tools)
    context = ToolContext.from_settings(settings)
    wire = claim_stdio()
    import anyio

    try:
        anyio.run(serve, context, tools, wire)
    finally:
        if wire is not None:
            wire.restore()


if __name__ == "__main__":
    main()
