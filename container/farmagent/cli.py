"""`farmagent`: the farm tools from a shell inside the sandbox (`farmagent tools`, `farmagent call NAME JSON`)."""

from __future__ import annotations

import argparse
import json
import sys

from farmagent.errors import ConfigError
from farmagent.tools import TOOLS, ToolContext, call_tool


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit status 0 success, 1 the tool failed, 2 bad usage or configuration."""
    parser = argparse.ArgumentParser(
        prog="farmagent",
        description="Call the farm tools (the same ones the MCP server and the runner offer) through "
        "FARMAGENT_IPC_DIR (default /workspace/ipc), and on the workspace (FARMAGENT_GROUP_DIR) and farm-state "
        "(FARMAGENT_FARM_STATE_DIR) for memory_write and farm_state_read. Results and errors are printed as JSON.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tools", help="list the tools with their descriptions and JSON Schemas")
    call = sub.add_parser("call", help="call one tool and print its JSON result")
    call.add_argument("name", help="the tool, e.g. ping or memory_search")
    call.add_argument("arguments", nargs="?", default="{}", help='a JSON object, e.g. \'{"query": "pump"}\'')
    args = parser.parse_args(argv)
    if args.command == "tools":
        listing = [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in TOOLS]
        print(json.dumps(listing, indent=2, ensure_ascii=False))
        return 0
    try:
        arguments = json.loads(args.arguments)
        context = ToolContext.from_env()
    except json.JSONDecodeError as err:
        print(f"farmagent: the arguments are not valid JSON: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"farmagent: {err}", file=sys.stderr)
        return 2
    if not isinstance(arguments, dict):
        print("farmagent: the arguments must be a JSON object", file=sys.stderr)
        return 2
    outcome = call_tool(context, args.name, arguments)
    print(outcome.text)
    return 1 if outcome.is_error else 0


if __name__ == "__main__":
    sys.exit(main())
