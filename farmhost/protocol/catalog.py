"""One row per farm action, memory action and request type: what the contract, the host and the sandbox derive.

An action's row holds its name, params model, effect class, timeout and the text of its tool (description, hints,
result); a request type's row the text of its tool. From these rows come the closed sets (`FARM_ACTIONS`,
`CONTROL_ACTIONS`, ...), the params of each action in the JSON Schema export, the host's farm handlers
(farm/actions.py binds each row to the function of the same name) and the sandbox's tool table
(`farmhost schema --tools`, shipped as `farmagent/tool_table.json`: farmagent cannot import farmhost).
Adding an action is a row here and its implementation (docs/farm-actions.md "Adding an action").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Literal

from farmhost.protocol.params import (
    ActionParams,
    HaApplyDashboardParams,
    HaAssistParams,
    HaCallServiceParams,
    HaCaptureScreenshotParams,
    HaDashboardGetParams,
    HaDashboardPatchParams,
    HaDashboardValidateParams,
    HaGetStatusParams,
    HaHistoryParams,
    HaSetEntityParams,
    MemoryGetParams,
    MemorySearchParams,
    NoParams,
)

# 30 s: longer than any single HA call (10 s) and shorter than the agent client's wait (40 s), so the
# host always answers with an explicit `timeout` before the agent gives up.
DEFAULT_ACTION_TIMEOUT: Final = 30.0
# The sandbox waits this much longer than the action's own timeout: the router's 2 s margin, then the result
# file written and noticed, so the host's `timeout` answer always arrives before the agent gives up.
CLIENT_MARGIN: Final = 10.0
_MAIN_DEFAULT: Final = "Main group only, unless the farm profile opens it to other groups."


class ActionEffect(StrEnum):
    """What an action does to the world; it decides the gate, the receipts and what happens after a crash."""

    READ = "read"  # reads HA or farmhost's files: re-run after a crash
    CONTROL = "control"  # changes HA or the staged dashboard: gated by the profile, never re-run after a crash
    WRITES_FILES = "writes_files"  # writes files (a screenshot, farm-state): not control, not re-run blindly


@dataclass(frozen=True, kw_only=True)
class Hints:
    """What a tool call does to the world, for clients that ask before risky calls (MCP tool annotations)."""

    read_only: bool
    destructive: bool = False  # may undo or overwrite what was there (only meaningful when not read_only)
    idempotent: bool = False  # the same call again changes nothing more
    open_world: bool = False  # reaches past the farm's own files and memory: Home Assistant, a chat


READS: Final = Hints(read_only=True, idempotent=True)
READS_HA: Final = Hints(read_only=True, idempotent=True, open_world=True)
CONTROLS_HA: Final = Hints(read_only=False, destructive=True, open_world=True)


def result_schema(properties: Mapping[str, Any] | None = None, *required: str) -> dict[str, Any]:
    """The schema of a tool's result: an object with these `properties` (more may come from a newer host)."""
    return {"type": "object", "properties": dict(properties or {}), "required": list(required)}


@dataclass(frozen=True, kw_only=True)
class Tool:
    """What the sandbox's model is told about a request or action: the tool's text, hints and result."""

    description: str
    hints: Hints
    result: dict[str, Any] = field(default_factory=result_schema)
    name: str | None = None  # the tool's name when it is not the request type's or the action's
    main_only: bool = False  # the SPEC refuses it outside main whatever the profile says


@dataclass(frozen=True, kw_only=True)
class ActionRow:
    """One farm or memory action: everything about it but its implementation."""

    name: str
    params: type[ActionParams]
    effect: ActionEffect
    tool: Tool
    timeout: float = DEFAULT_ACTION_TIMEOUT  # the host's; the sandbox waits CLIENT_MARGIN longer


@dataclass(frozen=True, kw_only=True)
class RequestRow:
    """A request type an agent writes directly (not an action): its tool and the request fields it offers."""

    type: str
    fields: tuple[str, ...] = ()
    tool: Tool


REQUESTS: Final[tuple[RequestRow, ...]] = (
    RequestRow(
        type="message",
        fields=("chatJid", "text"),
        tool=Tool(
            name="send_message",
            hints=Hints(read_only=False, open_world=True),
            result=result_schema(
                {"queued": {"type": "boolean"}, "chatJid": {"type": "string"}, "chunks": {"type": "integer"}}
            ),
            description="Send a text message to a chat. Any group may message its own chat; the main group may "
            "message any registered chat. Long text is split for Telegram, never cut. Returns {queued, chatJid, "
            "chunks}.",
        ),
    ),
    RequestRow(
        type="file",
        fields=("chatJid", "path", "caption"),
        tool=Tool(
            name="send_file",
            hints=Hints(read_only=False, open_world=True),
            description="Send a file from this group's workspace (a path relative to it, e.g. a screenshot's "
            "'screenshots/x.png') to a chat, as a photo or document. Same chats as send_message.",
        ),
    ),
    RequestRow(
        type="schedule_task",
        fields=("prompt", "schedule_type", "schedule_value", "context_mode", "groupFolder", "taskId"),
        tool=Tool(
            hints=Hints(read_only=False),
            result=result_schema(
                {
                    "taskId": {"type": "string"},
                    "nextRun": {"type": ["string", "null"]},
                    "warning": {"type": "string"},
                },
                "taskId",
            ),
            description="Schedule a prompt to run as an agent later. schedule_type 'cron' (5 fields, farm's time "
            "zone, e.g. '0 6 * * *'), 'interval' (milliseconds, as text or number) or 'once' (ISO-8601, farm's local "
            "time unless an offset is given). Or 'when', to be woken by a farm event: schedule_value is then a JSON "
            'object (not a string), {"entity": "sensor.field_1_soil_moisture", "below": 25, "for": 600} (above/below '
            'a number, or "state": "on"; "for": seconds it must hold first) or {"alert": "frost"} (a new alert of '
            'that rule), plus "cooldown" seconds (default 3600, min 5). It runs once each time the condition becomes '
            "true (not while it stays true, not if it is already true now), at most once per cooldown, and the run's "
            "prompt starts with the event (entity, old and new state, when). An entity Home Assistant does not know "
            "is accepted with a warning. Only main may set groupFolder to schedule for another group. "
            "Returns {taskId, nextRun} (nextRun null for a when task; plus a warning if there is one).",
        ),
    ),
    RequestRow(
        type="pause_task",
        fields=("taskId",),
        tool=Tool(
            hints=Hints(read_only=False, idempotent=True),
            description="Pause a scheduled task (this group's own tasks; main: any task).",
        ),
    ),
    RequestRow(
        type="resume_task",
        fields=("taskId",),
        tool=Tool(
            hints=Hints(read_only=False, idempotent=True),
            description="Resume a paused task; a next run that passed while it was paused is recomputed.",
        ),
    ),
    RequestRow(
        type="cancel_task",
        fields=("taskId",),
        tool=Tool(
            hints=Hints(read_only=False, destructive=True, idempotent=True),
            description="Cancel a scheduled task for good (this group's own tasks; main: any task).",
        ),
    ),
    RequestRow(
        type="refresh_groups",
        tool=Tool(
            hints=Hints(read_only=False, idempotent=True),
            description="Re-read the known chats and rewrite the group list (main group only).",
            main_only=True,
        ),
    ),
    RequestRow(
        type="register_group",
        fields=("jid", "name", "folder", "trigger", "requiresTrigger"),
        tool=Tool(
            hints=Hints(read_only=False),
            description="Register a chat as a new group with its own workspace (main group only). folder: 1-64 "
            "letters, digits, '_' or '-'; not 'global' or 'errors'. A new group is never the main group.",
            main_only=True,
        ),
    ),
    RequestRow(
        type="ping",
        tool=Tool(
            hints=READS,
            result=result_schema(
                {"pong": {"type": "boolean"}, "version": {"type": "string"}, "startedAt": {"type": "string"}}, "pong"
            ),
            description="Check that the farm host answers. Returns {pong, version, startedAt}.",
        ),
    ),
)

MEMORY_ROWS: Final[tuple[ActionRow, ...]] = (
    ActionRow(
        name="memory_search",
        params=MemorySearchParams,
        effect=ActionEffect.READ,
        tool=Tool(
            hints=READS,
            result=result_schema({"hits": {"type": "array", "items": {"type": "object"}}}, "hits"),
            description="Search the farm's memory: this group's MEMORY.md and memory/*.md, the global farm memory, "
            "and (sources 'sessions' or 'all') this group's chat history. Returns {hits: [{citation, groupFolder, "
            "snippet, score, ...}]}; open a hit with memory_get. Other groups' memory: main only.",
        ),
    ),
    ActionRow(
        name="memory_get",
        params=MemoryGetParams,
        effect=ActionEffect.READ,
        tool=Tool(
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
        ),
    ),
)

FARM_ROWS: Final[tuple[ActionRow, ...]] = (
    ActionRow(
        name="ha_get_status",
        params=HaGetStatusParams,
        effect=ActionEffect.READ,
        tool=Tool(
            hints=READS_HA,
            result=result_schema({"missing": {"type": "array", "items": {"type": "string"}}}),
            description="Current Home Assistant states, filtered: an entity is returned when it is in entityIds or "
            "its domain is in domains (none given: all). Unknown ids are listed in 'missing'. " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_call_service",
        params=HaCallServiceParams,
        effect=ActionEffect.CONTROL,
        tool=Tool(
            hints=CONTROLS_HA,
            description="Call a Home Assistant service, e.g. domain 'switch', service 'turn_on', target "
            "{'entity_id': 'switch.irrigation_pump'}. Returns the states it changed. Only the entity services of "
            "devices and helpers (switch, light, fan, valve, cover, climate, number, select, input_*, ...), addressed "
            "to entities; scenes, scripts, automations, reloads, notifications and the rest only where the farm "
            "profile opens them, Assist only through ha_assist, host-level domains (homeassistant, shell_command, "
            "...) never. Turning a guarded device off (its safe state) is never held for approval or by a rate. "
            + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_set_entity",
        params=HaSetEntityParams,
        effect=ActionEffect.CONTROL,
        tool=Tool(
            hints=Hints(read_only=False, destructive=True, idempotent=True, open_world=True),
            description="Set one entity: input_number/number to a number in its range; input_boolean/switch/light/"
            "fan on or off (true/false, 'on'/'off'); input_select/select to one of its options. Returns the state "
            "read back and whether it is confirmed. " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_restart",
        params=NoParams,
        effect=ActionEffect.CONTROL,
        # HA restarts in ~7 s here, 30-90 s on a Raspberry Pi; core_actions.RESTART_TIMEOUT is 150 s.
        timeout=160.0,
        tool=Tool(
            hints=CONTROLS_HA,
            description="Restart Home Assistant and wait until it runs again (up to a few minutes on a Raspberry "
            "Pi). Use only when asked to. " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_dashboard_get",
        params=HaDashboardGetParams,
        effect=ActionEffect.READ,
        tool=Tool(
            hints=READS,
            description="Read the staged Lovelace dashboard (its views, config and YAML), or one view by viewPath. "
            + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_dashboard_validate",
        params=HaDashboardValidateParams,
        effect=ActionEffect.READ,
        tool=Tool(
            hints=READS_HA,
            result=result_schema(
                {"valid": {"type": "boolean"}, "errors": {"type": "array"}, "warnings": {"type": "array"}}, "valid"
            ),
            description="Check the staged dashboard, or YAML given in content (not both): syntax, structure and, "
            "with checkEntities, entity ids Home Assistant does not know. Returns {valid, errors, warnings}. "
            + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_dashboard_patch",
        params=HaDashboardPatchParams,
        effect=ActionEffect.CONTROL,
        tool=Tool(
            hints=Hints(read_only=False, destructive=True),
            description="Change the staged dashboard with operations (all or nothing, comments kept): add_view, "
            "update_view, remove_view, move_view, add_card, update_card, remove_card, move_card, set_theme; each an "
            "object with 'op' and its fields (docs/dashboards.md). dryRun shows the diff without writing. "
            + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_apply_dashboard",
        params=HaApplyDashboardParams,
        effect=ActionEffect.CONTROL,
        tool=Tool(
            hints=Hints(read_only=False, destructive=True, idempotent=True, open_world=True),
            description="Validate the staged dashboard and push it to Home Assistant, backing up what HA had. "
            + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_capture_screenshot",
        params=HaCaptureScreenshotParams,
        effect=ActionEffect.WRITES_FILES,
        timeout=35.0,  # above the capture's own CAPTURE_TIMEOUT (30 s), so its clearer message wins
        tool=Tool(
            hints=Hints(read_only=False, open_world=True),
            result=result_schema({"path": {"type": "string"}}),
            description="Take a PNG screenshot of a dashboard view into this group's workspace; returns its path "
            "(send it with send_file). " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="farm_state_refresh",
        params=NoParams,
        effect=ActionEffect.WRITES_FILES,
        tool=Tool(
            hints=Hints(read_only=False, idempotent=True, open_world=True),
            description="Poll Home Assistant now and rewrite the farm-state files. " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_assist",
        params=HaAssistParams,
        # Control: Home Assistant's Assist may switch whatever is exposed to it (farmhost/farm/assist.py). Three HA
        # calls (exposed entities, registry, states) and Assist's own service calls, each within 10 s.
        effect=ActionEffect.CONTROL,
        tool=Tool(
            hints=CONTROLS_HA,
            result=result_schema(
                {"speech": {"type": "string"}, "responseType": {"type": "string"}, "targets": {"type": "array"}},
                "speech",
            ),
            description="Say a sentence to Home Assistant's own assistant (Assist, no model): it understands simple "
            "commands and questions about exposed entities ('turn on the irrigation pump', 'is the barn light on') "
            "and acts. Returns its spoken answer in 'speech' and the entities it acted on. Prefer ha_set_entity or "
            "ha_call_service when you know the entity id. " + _MAIN_DEFAULT,
        ),
    ),
    ActionRow(
        name="ha_history",
        params=HaHistoryParams,
        effect=ActionEffect.READ,
        tool=Tool(
            hints=READS_HA,
            result=result_schema({"missing": {"type": "array", "items": {"type": "string"}}}),
            description="What entities did over a period, from Home Assistant's recorder (at most 31 days; default "
            "the last 24 h; times without an offset are farm time): numbers as min, max, time-weighted mean, last and "
            "up to 48 points; on/off entities as onSeconds and turnedOn (how often switched on); other states as "
            "seconds per state. Answers 'how long did the pump run yesterday?' or 'how cold did it get last night?'. "
            "Unknown ids are listed in 'missing'. " + _MAIN_DEFAULT,
        ),
    ),
)

# The closed sets, in the rows' order (the order of the JSON Schema export's enums).
FARM_ACTIONS: Final[tuple[str, ...]] = tuple(row.name for row in FARM_ROWS)
MEMORY_ACTIONS: Final[tuple[str, ...]] = tuple(row.name for row in MEMORY_ROWS)
ACTION_ROWS: Final[dict[str, ActionRow]] = {row.name: row for row in (*FARM_ROWS, *MEMORY_ROWS)}
ACTION_PARAMS: Final[dict[str, type[ActionParams]]] = {name: row.params for name, row in ACTION_ROWS.items()}
CONTROL_ACTIONS: Final = frozenset(row.name for row in FARM_ROWS if row.effect is ActionEffect.CONTROL)
FILE_WRITING_ACTIONS: Final = frozenset(row.name for row in FARM_ROWS if row.effect is ActionEffect.WRITES_FILES)
REQUEST_ROWS: Final[dict[str, RequestRow]] = {row.type: row for row in REQUESTS}

if TYPE_CHECKING:  # a Literal built from the rows is opaque to mypy; the models below validate against it
    FarmActionName = str
    MemoryActionName = str
else:
    FarmActionName = Literal[FARM_ACTIONS]
    MemoryActionName = Literal[MEMORY_ACTIONS]

if len(ACTION_ROWS) != len(FARM_ROWS) + len(MEMORY_ROWS):
    raise AssertionError("two action rows share a name")


def client_timeout(row: ActionRow) -> float | None:
    """How long the sandbox waits for the action's result; None when the client's own default (40 s) is enough."""
    return None if row.timeout == DEFAULT_ACTION_TIMEOUT else row.timeout + CLIENT_MARGIN
