"""TOOLS: every farm operation an agent has, defined once (name, description, JSON Schema, function).

The parameters of a tool that writes a request come from the contract the host exports (`tool_schemas.py`):
bounds, enums and parameter descriptions are the host's own. Only the tools that never reach the host
(`memory_write`, `farm_state_read`, the snapshot readers) describe their parameters here.

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
from farmagent.tool_schemas import action_parameters, request_parameters
from farmagent.workspace import FARM_STATE_FILES, MAX_MEMORY_BYTES, WRITE_MODES, farm_state_read, memory_write

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
        parameters=request_parameters("message", "chatJid", "text"),
        run=lambda ctx, a: ctx.client.send_message(a["chatJid"], a["text"]),
    ),
    ToolSpec(
        name="send_file",
        hints=Hints(read_only=False, open_world=True),
        result=result_schema(),
        description="Send a file from this group's workspace (a path relative to it, e.g. a screenshot's "
        "'screenshots/x.png') to a chat, as a photo or document. Same chats as send_message.",
        parameters=request_parameters("file", "chatJid", "path", "caption"),
        run=lambda ctx, a: ctx.client.send_file(a["chatJid"], a["path"], a.get("caption")),
    ),
    ToolSpec(
        name="schedule_task",
        hints=Hints(read_only=False),
        result=result_schema(
            {
                "taskId": {"type": "string"},
                "nextRun": {"type": ["string", "null"]},
                "condition": {"type": "object"},
                "warning": {"type": "string"},
            },
            "taskId",
        ),
        description="Schedule a prompt to run as an agent later. schedule_type 'cron' (5 fields, farm's time zone, "
        "e.g. '0 6 * * *'), 'interval' (milliseconds, as text or number) or 'once' (ISO-8601, farm's local time "
        "unless an offset is given). Or 'when', to be woken by a farm event: schedule_value is then a JSON object "
        '(not a string), {"entity": "sensor.field_1_soil_moisture", "below": 25, "for": 600} (above/below a '
        'number, or "state": "on"; "for": seconds it must hold first) or {"alert": "frost"} (a new alert of that '
        'rule), plus "cooldown" seconds (default 3600, min 5). It runs once each time the condition becomes true '
        "(not while it stays true, not if it is already true now), at most once per cooldown, and the run's "
        "prompt starts with the event (entity, old and new state, when). An entity Home Assistant does not know "
        "is accepted with a warning. Only main may set groupFolder to schedule for another group. "
        "Returns {taskId, nextRun} (nextRun null for a when task; plus condition and any warning).",
        parameters=request_parameters(
            "schedule_task", "prompt", "schedule_type", "schedule_value", "context_mode", "groupFolder", "taskId"
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
        parameters=request_parameters("pause_task", "taskId"),
        run=lambda ctx, a: ctx.client.pause_task(a["taskId"]),
    ),
    ToolSpec(
        name="resume_task",
        hints=Hints(read_only=False, idempotent=True),
        result=result_schema(),
        description="Resume a paused task; a next run that passed while it was paused is recomputed.",
        parameters=request_parameters("resume_task", "taskId"),
        run=lambda ctx, a: ctx.client.resume_task(a["taskId"]),
    ),
    ToolSpec(
        name="cancel_task",
        hints=Hints(read_only=False, destructive=True, idempotent=True),
        result=result_schema(),
        description="Cancel a scheduled task for good (this group's own tasks; main: any task).",
        parameters=request_parameters("cancel_task", "taskId"),
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
        parameters=request_parameters("refresh_groups"),
        run=lambda ctx, a: ctx.client.refresh_groups(),
        main_only=True,
    ),
    ToolSpec(
        name="register_group",
        hints=Hints(read_only=False),
        result=result_schema(),
        description="Register a chat as a new group with its own workspace (main group only). folder: 1-64 "
        "letters, digits, '_' or '-'; not 'global' or 'errors'. A new group is never the main group.",
        parameters=request_parameters("register_group", "jid", "name", "folder", "trigger", "requiresTrigger"),
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
        parameters=request_parameters("ping"),
        run=lambda ctx, a: ctx.client.ping(),
    ),
    ToolSpec(
        name="memory_search",
        hints=READS,
        result=result_schema({"hits": {"type": "array", "items": {"type": "object"}}}, "hits"),
        description="Search the farm's memory: this group's MEMORY.md and memory/*.md, the global farm memory, and "
        "(sources 'sessions' or 'all') this group's chat history. Returns {hits: [{citation, groupFolder, snippet, "
        "score, ...}]}; open a hit with memory_get. Other groups' memory: main only.",
        parameters=action_parameters("memory_search"),
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
        parameters=action_parameters("memory_get"),
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
        parameters=action_parameters("ha_get_status"),
        run=lambda ctx, a: ctx.client.ha_get_status(a.get("entityIds"), a.get("domains")),
    ),
    ToolSpec(
        name="ha_history",
        hints=READS_HA,
        result=result_schema({"missing": {"type": "array", "items": {"type": "string"}}}),
        farm_action=True,
        description="What entities did over a period, from Home Assistant's recorder (at most 31 days; default the "
        "last 24 h; times without an offset are farm time): numbers as min, max, time-weighted mean, last and up to "
        "48 points; on/off entities as onSeconds and turnedOn (how often switched on); other states as seconds per "
        "state. Answers 'how long did the pump run yesterday?' or 'how cold did it get last night?'. Unknown ids are "
        f"listed in 'missing'. {_MAIN_DEFAULT}",
        parameters=action_parameters("ha_history"),
        run=lambda ctx, a: ctx.client.ha_history(a["entityIds"], a.get("start"), a.get("end")),
    ),
    ToolSpec(
        name="ha_call_service",
        hints=Hints(read_only=False, destructive=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Call a Home Assistant service, e.g. domain 'switch', service 'turn_on', target "
        "{'entity_id': 'switch.irrigation_pump'}. Returns the states it changed. Only the entity services of devices "
        "and helpers (switch, light, fan, valve, cover, climate, number, select, input_*, ...), addressed to entities; "
        "scenes, scripts, automations, reloads, notifications and the rest only where the farm profile opens them, "
        "Assist only through ha_assist, host-level domains (homeassistant, shell_command, ...) never. Turning a "
        f"guarded device off (its safe state) is never held for approval or by a rate. {_MAIN_DEFAULT}",
        parameters=action_parameters("ha_call_service"),
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
        parameters=action_parameters("ha_set_entity"),
        run=lambda ctx, a: ctx.client.ha_set_entity(a["entityId"], a["value"]),
    ),
    ToolSpec(
        name="ha_restart",
        hints=Hints(read_only=False, destructive=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Restart Home Assistant and wait until it runs again (up to a few minutes on a Raspberry Pi). "
        f"Use only when asked to. {_MAIN_DEFAULT}",
        parameters=action_parameters("ha_restart"),
        run=lambda ctx, a: ctx.client.ha_restart(),
    ),
    ToolSpec(
        name="ha_dashboard_get",
        hints=READS,
        result=result_schema(),
        farm_action=True,
        description="Read the staged Lovelace dashboard (its views, config and YAML), or one view by viewPath. "
        f"{_MAIN_DEFAULT}",
        parameters=action_parameters("ha_dashboard_get"),
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
        parameters=action_parameters("ha_dashboard_validate"),
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
        parameters=action_parameters("ha_dashboard_patch"),
        run=lambda ctx, a: ctx.client.ha_dashboard_patch(a["operations"], a.get("dashboard"), a.get("dryRun")),
    ),
    ToolSpec(
        name="ha_apply_dashboard",
        hints=Hints(read_only=False, destructive=True, idempotent=True, open_world=True),
        result=result_schema(),
        farm_action=True,
        description="Validate the staged dashboard and push it to Home Assistant, backing up what HA had. "
        f"{_MAIN_DEFAULT}",
        parameters=action_parameters("ha_apply_dashboard"),
        run=lambda ctx, a: ctx.client.ha_apply_dashboard(a.get("dashboard"), a.get("backup")),
    ),
    ToolSpec(
        name="ha_capture_screenshot",
        hints=Hints(read_only=False, open_world=True),
        result=result_schema({"path": {"type": "string"}}),
        farm_action=True,
        description="Take a PNG screenshot of a dashboard view into this group's workspace; returns its path "
        f"(send it with send_file). {_MAIN_DEFAULT}",
        parameters=action_parameters("ha_capture_screenshot"),
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
        parameters=action_parameters("farm_state_refresh"),
        run=lambda ctx, a: ctx.client.farm_state_refresh(),
    ),
    ToolSpec(
        name="ha_assist",
        hints=Hints(read_only=False, destructive=True, open_world=True),
        result=result_schema(
            {"speech": {"type": "string"}, "responseType": {"type": "string"}, "targets": {"type": "array"}}, "speech"
        ),
        farm_action=True,
        description="Say a sentence to Home Assistant's own assistant (Assist, no model): it understands simple "
        "commands and questions about exposed entities ('turn on the irrigation pump', 'is the barn light on') and "
        "acts. Returns its spoken answer in 'speech' and the entities it acted on. Prefer ha_set_entity or "
        f"ha_call_service when you know the entity id. {_MAIN_DEFAULT}",
        parameters=action_parameters("ha_assist"),
        run=lambda ctx, a: ctx.client.farm_action("ha_assist", {k: v for k, v in a.items() if v is not None}),
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
