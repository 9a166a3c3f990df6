"""TOOLS: every farm operation an agent has, defined once (name, description, JSON Schema, function).

The MCP server (`mcp_server.py`), the LLM runner (`loop.py`) and the shell CLI (`cli.py`) all serve exactly
this table through `call_tool`, so a tool behaves the same for Claude Code over MCP and for the built-in runner.
Adding an operation means adding a row. A tool runs with a `ToolContext`: the IPC client for the requests to
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
from farmagent.workspace import FARM_STATE_FILES, MAX_MEMORY_BYTES, WRITE_MODES, farm_state_read, memory_write

_JID = {"type": "string", "minLength": 3, "maxLength": 256, "description": "chat id, e.g. telegram:-1001234"}
_TASK_ID = {"type": "string", "minLength": 1, "maxLength": 128, "description": "the task's id (see list_tasks)"}
_FOLDER = {
    "type": "string",
    "minLength": 1,
    "maxLength": 64,
    "description": "another group's folder (main only); default this group",
}
_DASHBOARD = {"type": "string", "minLength": 1, "maxLength": 64, "description": "dashboard name (default 'farm')"}
_MAIN_DEFAULT = "Main group only, unless the farm profile opens it to other groups."


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


TOOLS: Final[tuple[ToolSpec, ...]] = (
    ToolSpec(
        name="send_message",
        hints=Hints(read_only=False, open_world=True),
        result=result_schema(
            {"queued": {"type": "boolean"}, "chatJid": {"type": "string"}, "chunks": {"type": "integer"}}
        ),
        description="Send a text message to a chat. Any group may message its own chat; the main group may "
        "message any registered chat. Long text is split for Telegram, never cut. Returns {queued, chatJid, chunks}.",
        parameters=obj(
            {
                "chatJid": _JID,
                "text": {"type": "string", "minLength": 1, "maxLength": 65536, "description": "the message"},
            },
            "chatJid",
            "text",
        ),
        run=lambda ctx, a: ctx.client.send_message(a["chatJid"], a["text"]),
    ),
    ToolSpec(
        name="send_file",
        hints=Hints(read_only=False, open_world=True),
        result=result_schema(),
        description="Send a file from this group's workspace (a path relative to it, e.g. a screenshot's "
        "'screenshots/x.png') to a chat, as a photo or document. Same chats as send_message.",
        parameters=obj(
            {
                "chatJid": _JID,
                "path": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "description": "relative to the workspace",
                },
                "caption": {"type": "string", "maxLength": 1024, "description": "text shown with the file"},
            },
            "chatJid",
            "path",
        ),
        run=lambda ctx, a: ctx.client.send_file(a["chatJid"], a["path"], a.get("caption")),
    ),
    ToolSpec(
        name="schedule_task",
        hints=Hints(read_only=False),
        result=result_schema({"taskId": {"type": "string"}, "nextRun": {"type": ["string", "null"]}}, "taskId"),
        description="Schedule a prompt to run as an agent later. schedule_type 'cron' (5 fields, farm's time zone, "
        "e.g. '0 6 * * *'), 'interval' (milliseconds, at least 1000, as text or number) or 'once' (ISO-8601, farm's "
        "local time unless an offset is given). context_mode 'group' continues the group's conversation, "
        "'isolated' (default) starts fresh. Only main may set groupFolder to schedule for another group. "
        "Returns {taskId, nextRun}.",
        parameters=obj(
            {
                "prompt": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 16384,
                    "description": "what the agent is asked",
                },
                "schedule_type": {
                    "type": "string",
                    "enum": ["cron", "interval", "once"],
                    "description": "kind of schedule",
                },
                "schedule_value": {
                    "type": ["string", "integer"],
                    "description": "cron expression, interval in ms, or ISO-8601 time",
                },
                "context_mode": {"type": "string", "enum": ["isolated", "group"], "description": "default isolated"},
                "groupFolder": _FOLDER,
                "taskId": {"type": "string", "minLength": 1, "maxLength": 128, "description": "choose the id"},
            },
            "prompt",
            "schedule_type",
            "schedule_value",
        ),
        run=lambda ctx, a: ctx.client.schedule_task(
            a["prompt"],
            a["schedule_type"],
            a["schedule_value"],
            context_mode=a.get("context_mode"),
            group_folder=a.get("groupFolder"),
            task_id=a.get("taskId"),
        ),
    ),
    ToolSpec(
        name="pause_task",
        hints=Hints(read_only=False, idempotent=True),
        result=result_schema(),
        description="Pause a scheduled task (this group's own tasks; main: any task).",
        parameters=obj({"taskId": _TASK_ID}, "taskId"),
        run=lambda ctx, a: ctx.client.pause_task(a["taskId"]),
    ),
    ToolSpec(
        name="resume_task",
        hints=Hints(read_only=False, idempotent=True),
        result=result_schema(),
        description="Resume a paused task; a next run that passed while it was paused is recomputed.",
        parameters=obj({"taskId": _TASK_ID}, "taskId"),
        run=lambda ctx, a: ctx.client.resume_task(a["taskId"]),
    ),
    ToolSpec(
        name="cancel_task",
        hints=Hints(read_only=False, destructive=True, idempotent=True),
        result=result_schema(),
        description="Cancel a scheduled task for good (this group's own tasks; main: any task).",
        parameters=obj({"taskId": _TASK_ID}, "taskId"),
        run=lambda ctx, a: ctx.client.cancel_task(a["taskId"]),
    ),
    ToolSpec(
        name="list_tasks",
        hints=READS,
        result=result_schema({"tasks": {"type": "array", "items": {"type": "object"}}}, "tasks"),
        description="List the scheduled tasks this group can see (main sees all): id, groupFolder, prompt, "
        "schedule, context_mode, status, next_run, last_run. Reads the host's snapshot; no request.",
        parameters=obj({}),
        run=lambda ctx, a: {"tasks": ctx.client.current_tasks()},
    ),
    ToolSpec(
        name="list_groups",
        hints=READS,
        result=result_schema({"groups": {"type": "array", "items": {"type": "object"}}, "lastSync": {}}, "groups"),
        description="List the chats the host knows, registered or not (main group only; other groups get an "
        "empty list). Reads the host's snapshot; no request.",
        parameters=obj({}),
        run=lambda ctx, a: ctx.client.available_groups(),
        main_only=True,
    ),
    ToolSpec(
        name="refresh_groups",
        hints=Hints(read_only=False, idempotent=True),
        result=result_schema(),
        description="Re-read the known chats and rewrite the group list (main group only).",
        parameters=obj({}),
        run=lambda ctx, a: ctx.client.refresh_groups(),
        main_only=True,
    ),
    ToolSpec(
        name="register_group",
        hints=Hints(read_only=False),
        result=result_schema(),
        description="Register a chat as a new group with its own workspace (main group only). folder: 1-64 "
        "letters, digits, '_' or '-'; not 'global' or 'errors'. A new group is never the main group.",
        parameters=obj(
            {
                "jid": _JID,
                "name": {"type": "string", "minLength": 1, "maxLength": 200, "description": "display name"},
                "folder": {**_FOLDER, "description": "the new group's workspace folder"},
                "trigger": {"type": "string", "minLength": 1, "maxLength": 100, "description": "e.g. @farm"},
                "requiresTrigger": {"type": "boolean", "description": "answer only messages with the trigger"},
            },
            "jid",
            "name",
            "folder",
        ),
        run=lambda ctx, a: ctx.client.register_group(
            a["jid"], a["name"], a["folder"], a.get("trigger"), a.get("requiresTrigger")
        ),
        main_only=True,
    ),
    ToolSpec(
        name="ping",
        hints=READS,
        result=result_schema(
            {"pong": {"type": "boolean"}, "version": {"type": "string"}, "startedAt": {"type": "string"}}, "pong"
        ),
        description="Check that the farm host answers. Returns {pong, version, startedAt}.",
        parameters=obj({}),
        run=lambda ctx, a: ctx.client.ping(),
    ),
    ToolSpec(
        name="memory_search",
        hints=READS,
        result=result_schema({"hits": {"type": "array", "items": {"type": "object"}}}, "hits"),
        description="Search the farm's memory: this group's MEMORY.md and memory/*.md, the global farm memory, and "
        "(sources 'sessions' or 'all') this group's chat history. Returns {hits: [{citation, groupFolder, snippet, "
        "score, ...}]}; open a hit with memory_get. Other groups' memory: main only.",
        parameters=obj(
            {
                "query": {"type": "string", "minLength": 1, "maxLength": 2000, "description": "words to look for"},
                "topK": {"type": "integer", "minimum": 1, "maximum": 64, "description": "hits to return (default 8)"},
                "sources": {
                    "type": "string",
                    "enum": ["memory", "sessions", "all"],
                    "description": "memory files, chat history, or both",
                },
                "groupFolder": _FOLDER,
            },
            "query",
        ),
        run=lambda ctx, a: ctx.client.memory_search(
            a["query"], top_k=a.get("topK"), sources=a.get("sources"), group_folder=a.get("groupFolder")
        ),
    ),
    ToolSpec(
        name="memory_get",
        hints=READS,
        result=result_schema(
            {
                "text": {"type": "string"},
                "totalLines": {"type": "integer"},
                "truncated": {"type": "boolean"},
                "nextFrom": {"type": ["integer", "null"]},
            },
            "text",
        ),
        description="Read lines of a memory file: 'MEMORY.md' or 'memory/<name>.md' of this group, or of the "
        "global memory with groupFolder 'global'. from: first line (1-based), lines: how many (default 200). "
        "Returns {text, totalLines, truncated, nextFrom}.",
        parameters=obj(
            {
                "path": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1024,
                    "description": "MEMORY.md or memory/<name>.md",
                },
                "groupFolder": {**_FOLDER, "description": "another group's folder (main only) or 'global'"},
                "from": {"type": "integer", "minimum": 1, "description": "first line, 1-based (default 1)"},
                "lines": {"type": "integer", "minimum": 1, "maximum": 2000, "description": "how many (default 200)"},
            },
            "path",
        ),
        run=lambda ctx, a: ctx.client.memory_get(
            a["path"], group_folder=a.get("groupFolder"), from_line=a.get("from"), lines=a.get("lines")
        ),
    ),
    ToolSpec(
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
    ),
    ToolSpec(
        name="farm_state_read",
        hints=READS,
        result=result_schema(),
        description="Read a farm-state file the host keeps from Home Assistant (no request, instant): 'current' "
        "(every entity's state and unit, the active alerts, haConnected), 'alerts' (active and recently resolved), "
        "'devices' (areas, devices and their entities), 'calendar' (upcoming events). Returns the file's JSON; times "
        "are the farm's local time.",
        parameters=obj(
            {"file": {"type": "string", "enum": list(FARM_STATE_FILES), "description": "which file"}}, "file"
        ),
        run=lambda ctx, a: farm_state_read(ctx.farm_state_dir, a["file"]),
    ),
    ToolSpec(
        name="ha_get_status",
        hints=READS_HA,
        result=result_schema({"missing": {"type": "array", "items": {"type": "string"}}}),
        farm_action=True,
        description="Current Home Assistant states, filtered: an entity is returned when it is in entityIds or its "
        f"domain is in domains (none given: all). Unknown ids are listed in 'missing'. {_MAIN_DEFAULT}",
        parameters=obj(
            {
                "entityIds": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": 500,
                    "description": "e.g. ['sensor.soil_moisture']",
                },
                "domains": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": 100,
                    "description": "e.g. ['switch', 'sensor']",
                },
            }
        ),
        run=lambda ctx, a: ctx.client.ha_get_status(a.get("entityIds"), a.get("domains")),
    ),
    ToolSpec(
        name="ha_call_service",
        hints=Hints(read_only=False, destructive=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Call a Home Assistant service, e.g. domain 'switch', service 'turn_on', target "
        "{'entity_id': 'switch.irrigation_pump'}. Returns the states it changed. Host-level domains (homeassistant, "
        f"hassio, shell_command, ...) are never allowed; the farm profile may narrow further. {_MAIN_DEFAULT}",
        parameters=obj(
            {
                "domain": {"type": "string", "minLength": 1, "maxLength": 64, "description": "e.g. switch"},
                "service": {"type": "string", "minLength": 1, "maxLength": 64, "description": "e.g. turn_on"},
                "data": {"type": "object", "description": "service data, e.g. {'brightness': 120}"},
                "target": {"type": "object", "description": "e.g. {'entity_id': 'switch.pump'}"},
            },
            "domain",
            "service",
        ),
        run=lambda ctx, a: ctx.client.ha_call_service(a["domain"], a["service"], a.get("data"), a.get("target")),
    ),
    ToolSpec(
        name="ha_set_entity",
        hints=Hints(read_only=False, destructive=True, idempotent=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Set one entity: input_number/number to a number in its range; input_boolean/switch/light/fan "
        "on or off (true/false, 'on'/'off'); input_select/select to one of its options. Returns the state read back "
        f"and whether it is confirmed. {_MAIN_DEFAULT}",
        parameters=obj(
            {
                "entityId": {
                    "type": "string",
                    "minLength": 3,
                    "maxLength": 255,
                    "description": "e.g. input_number.target",
                },
                "value": {"type": ["number", "string", "boolean"], "description": "number, on/off, or an option"},
            },
            "entityId",
            "value",
        ),
        run=lambda ctx, a: ctx.client.ha_set_entity(a["entityId"], a["value"]),
    ),
    ToolSpec(
        name="ha_restart",
        hints=Hints(read_only=False, destructive=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Restart Home Assistant and wait until it runs again (up to a few minutes on a Raspberry Pi). "
        f"Use only when asked to. {_MAIN_DEFAULT}",
        parameters=obj({}),
        run=lambda ctx, a: ctx.client.ha_restart(),
    ),
    ToolSpec(
        name="ha_dashboard_get",
        hints=READS,
        result=result_schema(),
        farm_action=True,
        description="Read the staged Lovelace dashboard (its views, config and YAML), or one view by viewPath. "
        f"{_MAIN_DEFAULT}",
        parameters=obj(
            {
                "dashboard": _DASHBOARD,
                "viewPath": {"type": "string", "minLength": 1, "maxLength": 64, "description": "one view"},
            }
        ),
        run=lambda ctx, a: ctx.client.ha_dashboard_get(a.get("dashboard"), a.get("viewPath")),
    ),
    ToolSpec(
        name="ha_dashboard_validate",
        hints=READS_HA,
        result=result_schema(
            {"valid": {"type": "boolean"}, "errors": {"type": "array"}, "warnings": {"type": "array"}}, "valid"
        ),
        farm_action=True,
        description="Check the staged dashboard, or YAML given in content (not both): syntax, structure and, with "
        f"checkEntities, entity ids Home Assistant does not know. Returns {{valid, errors, warnings}}. {_MAIN_DEFAULT}",
        parameters=obj(
            {
                "dashboard": _DASHBOARD,
                "content": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 262144,
                    "description": "YAML to check instead",
                },
                "checkEntities": {"type": "boolean", "description": "also look up the entity ids in HA"},
            }
        ),
        run=lambda ctx, a: ctx.client.ha_dashboard_validate(
            a.get("dashboard"), a.get("content"), a.get("checkEntities")
        ),
    ),
    ToolSpec(
        name="ha_dashboard_patch",
        hints=Hints(read_only=False, destructive=True),
        result=result_schema(),
        farm_action=True,
        description="Change the staged dashboard with operations (all or nothing, comments kept): add_view, "
        "update_view, remove_view, move_view, add_card, update_card, remove_card, move_card, set_theme; each an "
        "object with 'op' and its fields (docs/dashboards.md). dryRun shows the diff without writing. "
        f"{_MAIN_DEFAULT}",
        parameters=obj(
            {
                "operations": {
                    "type": "array",
                    "items": {"type": "object"},
                    "minItems": 1,
                    "maxItems": 100,
                    "description": "objects with 'op' and its fields",
                },
                "dashboard": _DASHBOARD,
                "dryRun": {"type": "boolean", "description": "show the diff, write nothing"},
            },
            "operations",
        ),
        run=lambda ctx, a: ctx.client.ha_dashboard_patch(a["operations"], a.get("dashboard"), a.get("dryRun")),
    ),
    ToolSpec(
        name="ha_apply_dashboard",
        hints=Hints(read_only=False, destructive=True, idempotent=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Validate the staged dashboard and push it to Home Assistant, backing up what HA had. "
        f"{_MAIN_DEFAULT}",
        parameters=obj(
            {"dashboard": _DASHBOARD, "backup": {"type": "boolean", "description": "back up HA's copy (default true)"}}
        ),
        run=lambda ctx, a: ctx.client.ha_apply_dashboard(a.get("dashboard"), a.get("backup")),
    ),
    ToolSpec(
        name="ha_capture_screenshot",
        hints=Hints(read_only=False, open_world=True),
        result=result_schema({"path": {"type": "string"}}),
        farm_action=True,
        description="Take a PNG screenshot of a dashboard view into this group's workspace; returns its path "
        "(send it with send_file). width 320-3840, height 240-2160, zoom 0.5-3, waitMs 0-15000 extra wait. "
        f"{_MAIN_DEFAULT}",
        parameters=obj(
            {
                "dashboard": _DASHBOARD,
                "view": {"type": "string", "minLength": 1, "maxLength": 64, "description": "view path"},
                "width": {"type": "integer", "minimum": 320, "maximum": 3840, "description": "pixels"},
                "height": {"type": "integer", "minimum": 240, "maximum": 2160, "description": "pixels"},
                "zoom": {"type": "number", "minimum": 0.5, "maximum": 3, "description": "page zoom"},
                "waitMs": {"type": "integer", "minimum": 0, "maximum": 15000, "description": "extra wait"},
                "selector": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 200,
                    "description": "CSS element to capture",
                },
            }
        ),
        run=lambda ctx, a: ctx.client.ha_capture_screenshot(
            a.get("dashboard"),
            a.get("view"),
            a.get("width"),
            a.get("height"),
            a.get("zoom"),
            a.get("waitMs"),
            a.get("selector"),
        ),
    ),
    ToolSpec(
        name="farm_state_refresh",
        hints=Hints(read_only=False, idempotent=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description=f"Poll Home Assistant now and rewrite the farm-state files. {_MAIN_DEFAULT}",
        parameters=obj({}),
        run=lambda ctx, a: ctx.client.farm_state_refresh(),
    ),
)

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
        args = dict(arguments or {})
        check(tool.parameters, args)
        result = tool.run(context, args)
    except FarmagentError as err:
        failure = {"errorCode": err.code, "error": err.message}
        return ToolOutcome(is_error=True, text=_dump(failure), value=failure)
    return ToolOutcome(is_error=False, text=_dump(result), value=result)


def _dump(document: Any) -> str:
    return json.dumps(document, ensure_ascii=False)
