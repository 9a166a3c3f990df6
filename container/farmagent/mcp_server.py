"""The farm tools as an MCP server over stdio, for any MCP-capable agent (Claude Code, OpenCode, ...).

Run `farmagent-mcp` or `python -m farmagent.mcp_server` inside the sandbox; it is configured by the
FARMAGENT_* variables (see `farmagent.config`): FARMAGENT_IPC_DIR above all, FARMAGENT_GROUP_DIR and
FARMAGENT_FARM_STATE_DIR for the tools that work on files (memory_write, farm_state_read). Every tool of
`farmagent.tools.TOOLS` is listed with its description and input schema; a call returns the operation's
result as JSON text, or an MCP tool error (`isError`) whose text is `{"errorCode": ..., "error": ...}`.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import anyio
import anyio.to_thread
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from farmagent import __version__
from farmagent.errors import ConfigError
from farmagent.tools import TOOLS, ToolContext, call_tool

INSTRUCTIONS: Final = (
    "Tools of a farm-agent appliance. You run in a sandbox with no network: everything outside your workspace "
    "(chat messages, scheduled tasks, memory search, Home Assistant) goes through these tools, and the host "
    "decides. A tool error's text is JSON with errorCode and error; read the error and adapt."
)


def build_server(context: ToolContext) -> Server[Any]:
    """An MCP server whose tools are `TOOLS`, run with `context`."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=tool.name, description=tool.description, input_schema=tool.parameters) for tool in TOOLS
            ]
        )

    async def run_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        # The tools block on files; a thread keeps the server answering other calls meanwhile.
        outcome = await anyio.to_thread.run_sync(call_tool, context, params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(text=outcome.text)], is_error=outcome.is_error)

    return Server(
        "farmagent",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=run_tool,
    )


async def serve(context: ToolContext) -> None:
    """Serve the tools on stdin/stdout until the client closes the connection."""
    server = build_server(context)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    """Entry point of `farmagent-mcp`: read FARMAGENT_* and serve over stdio."""
    try:
        context = ToolContext.from_env()
    except ConfigError as err:
        print(f"farmagent-mcp: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    anyio.run(serve, context)


if __name__ == "__main__":
    main()
