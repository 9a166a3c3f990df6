"""TOOLS: every farm operation an agent has, defined once (name, description, JSON Schema, function).

A tool that writes a request is generated from the host's tool table and contract (`tool_schemas.py`): its name,
description, hints and result are its row's on the host (farmhost/protocol/catalog.py), its bounds, enums and
parameter descriptions the host's own, and a call writes its arguments as the request's fields or the action's
params. Only the tools that never reach the host (`memory_write`, `farm_state_read`, the snapshot readers) are
written here.

The MCP server (`mcp_server.py`), the LLM runner (`loop.py`) and the shell CLI (`cli.py`) all serve exactly
this table through `call_tool`, so a tool behaves the same for Claude Code over MCP and for the built-in runner.
Adding a host operation means a row on the host; a local one, a ToolSpec here. A tool runs with a `ToolContext`: the IPC client for the requests to
the host, and the sandbox's own mounts for the tools that work on files directly (`memory_write`,
`farm_state_read`, see `workspace.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from farmagent.argcheck import check, obj
from farmagent.config import AgentSettings
from farmagent.errors import FarmagentError, InvalidRequestError
from farmagent.ipc.client import IpcClient
from farmagent.tool_schemas import action_parameters, request_parameters, tool_table
from farmagent.workspace import FARM_STATE_FILES, MAX_MEMORY_BYTES, WRITE_MODES, farm_state_read, memory_write


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool runs with: the host through `client`, and the sandbox's mounts it may touch itself."""

    client: IpcClient
    group_dir: Path  # the group's workspace (read-write): memory_write
    farm_state_dir: Path  # the host's farm-state files (read-only): farm_state_read

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> ToolContext:
        """The context of FARMAGENT_* settings, with a client on the group's IPC directory."""
        return cls(
            client=IpcClient(settings.ipc_dir, mode=settings.ipc_mode),
            group_dir=settings.group_dir,
            farm_state_dir=settings.farm_state_dir,
        )

    @classmethod
    def from_env(cls) -> ToolContext:
        """`from_settings(AgentSettings.from_env())`.

        Raises:
            ConfigError: a FARMAGENT_* variable cannot be used.
        """
        return cls.from_settings(AgentSettings.from_env())


@dataclass(frozen=True, kw_only=True)
class Hints:
    """What a call does to the world, for clients that ask before risky calls (MCP tool annotations)."""

    read_only: bool
    destructive: bool = False  # may undo or overwrite what was there (only meaningful when not read_only)
    idempotent: bool = False  # the same call again changes nothing more
    open_world: bool = False  # reaches past the farm's own files and memory: Home Assistant, a chat


READS: Final = Hints(read_only=True, idempotent=True)
READS_HA: Final = Hints(read_only=True, idempotent=True, open_world=True)


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """One tool: what the model sees (name, description, parameters, result) and what runs (run)."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[ToolContext, dict[str, Any]], Any]
    hints: Hints
    result: dict[str, Any]  # JSON Schema of what `run` returns (an object); properties the host adds are allowed
    main_only: bool = False  # the SPEC refuses it outside main whatever the profile says
    farm_action: bool = False  # a farm action: main only unless the farm profile's actionGroups opens it


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    """What a tool call produced: JSON `text` for the model, `is_error` when it failed, and the `value` as data."""

    is_error: bool
    text: str
    value: Any = None  # the result, or {"errorCode", "error"} when is_error


def result_schema(properties: Mapping[str, Any] | None = None, *required: str) -> dict[str, Any]:
    """The schema of a tool's result: an object with these `properties` (more may come from a newer host)."""
    return {"type": "object", "properties": dict(properties or {}), "required": list(required)}


# The tools that never reach the host: they read the host's snapshots or the sandbox's own mounts.
_LIST_TASKS: Final = ToolSpec(
    name="list_tasks",
    hints=READS,
    result=result_schema({"tasks": {"type": "array", "items": {"type": "object"}}}, "tasks"),
    description="List the scheduled tasks this group can see (main sees all): id, groupFolder, prompt, "
    "schedule, context_mode, status, next_run, last_run. Reads the host's snapshot; no request.",
    parameters=obj({}),
    run=lambda ctx, a: {"tasks": ctx.client.current_tasks()},
)
_LIST_GROUPS: Final = ToolSpec(
    name="list_groups",
    hints=READS,
    result=result_schema({"groups": {"type": "array", "items": {"type": "object"}}, "lastSync": {}}, "groups"),
    description="List the chats the host knows, registered or not (main group only; other groups get an "
    "empty list). Reads the host's snapshot; no request.",
    parameters=obj({}),
    run=lambda ctx, a: ctx.client.available_groups(),
    main_only=True,
)
_MEMORY_WRITE: Final = ToolSpec(
    name="memory_write",
    hints=Hints(read_only=False, destructive=True),
    result=result_schema(
        {"path": {"type": "string"}, "bytes": {"type": "integer"}, "lines": {"type": "integer"}},
        "path",
        "bytes",
        "lines",
    ),
    description="Write this group's memory: path 'MEMORY.md' (standing notes, shown at the start of every run) "
    "or 'memory/<topic>.md' (folders are created). mode 'append' (default) adds text at the end, 'replace' "
    f"rewrites the whole file. At most {MAX_MEMORY_BYTES // 1024} KiB a file. memory_search finds the new text at "
    "once. Returns {path, bytes, lines} of the file after the write.",
    parameters=obj(
        {
            "path": {"type": "string", "minLength": 1, "maxLength": 1024, "description": "e.g. memory/fields.md"},
            "text": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_MEMORY_BYTES,
                "description": "markdown to write",
            },
            "mode": {"type": "string", "enum": list(WRITE_MODES), "description": "append (default) or replace"},
        },
        "path",
        "text",
    ),
    run=lambda ctx, a: memory_write(ctx.group_dir, a["path"], a["text"], a.get("mode", "append")),
)
_FARM_STATE_READ: Final = ToolSpec(
    name="farm_state_read",
    hints=READS,
    result=result_schema(),
    description="Read a farm-state file the host keeps from Home Assistant (no request, instant): 'current' "
    "(every entity's state and unit, the active alerts, haConnected), 'alerts' (active and recently resolved), "
    "'devices' (areas, devices and their entities), 'calendar' (upcoming events). Returns the file's JSON; times "
    "are the farm's local time.",
    parameters=obj({"file": {"type": "string", "enum": list(FARM_STATE_FILES), "description": "which file"}}, "file"),
    run=lambda ctx, a: farm_state_read(ctx.farm_state_dir, a["file"]),
)
# Each local tool is offered next to the host's tool it goes with.
_LOCAL_AFTER: Final[dict[str, tuple[ToolSpec, ...]]] = {
    "cancel_task": (_LIST_TASKS, _LIST_GROUPS),
    "memory_get": (_MEMORY_WRITE, _FARM_STATE_READ),
}


def host_tool(entry: Mapping[str, Any]) -> ToolSpec:
    """The tool of one entry of the host's tool table: its text from the entry, its parameters from the contract.

    A call writes the request the entry names with the tool's arguments as they are: the arguments are the
    request's fields (a request tool) or the action's params (an action tool), named as the contract names them.
    """
    kind, action = str(entry["request"]), entry["action"]
    run: Callable[[ToolContext, dict[str, Any]], Any]
    if action is None:
        parameters = request_parameters(kind, *entry["fields"])
        run = lambda ctx, a: ctx.client.send_request(kind, a)
    elif kind == "farm_action":
        parameters = action_parameters(action)
        run = lambda ctx, a: ctx.client.farm_action(action, a)
    else:
        parameters = action_parameters(action)
        run = lambda ctx, a: ctx.client.memory_action(action, a)
    hints = entry["hints"]
    return ToolSpec(
        name=entry["name"],
        description=entry["description"],
        parameters=parameters,
        run=run,
        hints=Hints(
            read_only=hints["readOnly"],
            destructive=hints["destructive"],
            idempotent=hints["idempotent"],
            open_world=hints["openWorld"],
        ),
        result=entry["result"],
        main_only=entry["mainOnly"],
        farm_action=kind == "farm_action",
    )


def _all_tools() -> tuple[ToolSpec, ...]:
    tools: list[ToolSpec] = []
    for entry in tool_table():
        tools.append(host_tool(entry))
        tools.extend(_LOCAL_AFTER.get(tools[-1].name, ()))
    return tuple(tools)


TOOLS: Final[tuple[ToolSpec, ...]] = _all_tools()
TOOLS_BY_NAME: Final = {tool.name: tool for tool in TOOLS}


def tools_for(*, is_main: bool, farm_actions: bool = True) -> tuple[ToolSpec, ...]:
    """The tools worth offering to a group: tools the SPEC reserves for main are left out elsewhere.

    Outside main, `farm_actions=False` also leaves out the farm actions (refused there unless the farm profile
    opens them). The host decides either way; this only spares the model tools it cannot use.
    """
    return tuple(tool for tool in TOOLS if is_main or not (tool.main_only or (tool.farm_action and not farm_actions)))


def call_tool(context: ToolContext, name: str, arguments: Mapping[str, Any] | None) -> ToolOutcome:
    """Check the arguments, run the tool and turn its result or its error into JSON text.

    Errors the model can act on (bad arguments, a refusal by the host with its `errorCode`, a stopped host, no
    result in time, a local tool's refusal) come back as `is_error` outcomes: `{"errorCode": ..., "error": ...}`. Anything else is a
    bug and propagates.
    """
    tool = TOOLS_BY_NAME.get(name)
    try:
        if tool is None:
            raise InvalidRequestError(f"there is no tool {name!r}; tools: {', '.join(TOOLS_BY_NAME)}")
        # null means the default, as on the host: models often send it for an argument they leave out.
        args = {key: value for key, value in (arguments or {}).items() if value is not None}
        args = check(tool.parameters, args)
        result = tool.run(context, args)
    except FarmagentError as err:
        failure = {"errorCode": err.code, "error": err.message}
        return ToolOutcome(is_error=True, text=_dump(failure), value=failure)
    return ToolOutcome(is_error=False, text=_dump(result), value=result)


def _dump(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)
