"""The built-in runner's tool offer: a small default set in a compact form, the rest behind `find_tools`.

Every request of a run carries the offered tools, so they are what a small model reads most: the full
catalog is ~20,000 characters of JSON Schema (~5,000 tokens), the default set here about a fifth of it.
A farm conversation needs the tools of DEFAULT_TOOLS; the others (dashboards, screenshots, groups, tasks,
Assist, ...) are listed by `find_tools` (a word or a name: the matching tools with their full description
and parameters) and called through `use_tool` (or by their own name, for models that do). The offer is the
same for every group and every run, in a fixed order, so a server's prompt cache keeps it; what a group may
do is still the host's decision, and `find_tools` lists only the tools this group may use at all.

The compact form is for the model only: short descriptions of the runner's own (SHORT) and parameters
without the validation keywords (patterns, lengths, item counts). A call is still checked against the
tool's full parameters (`tools.call_tool`), and the host validates it again, so nothing is accepted that
was refused before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from farmagent.argcheck import check, obj
from farmagent.errors import FarmagentError, InvalidRequestError
from farmagent.tools import ToolContext, ToolOutcome, ToolSpec, call_tool

FIND_TOOLS: Final = "find_tools"
USE_TOOL: Final = "use_tool"
# What a farm conversation needs: readings, switching, memory, telling people, scheduling.
DEFAULT_TOOLS: Final = (
    "farm_state_read",
    "ha_get_status",
    "ha_set_entity",
    "ha_call_service",
    "memory_search",
    "memory_write",
    "send_message",
    "schedule_task",
)
# Tight texts of the default tools; the host's full text is what find_tools shows.
SHORT: Final = {
    "farm_state_read": "Read the farm's state, instantly: current (states, alerts), alerts, devices or calendar.",
    "ha_get_status": "Current Home Assistant states of entityIds or of whole domains (none: all).",
    "ha_set_entity": "Set one entity: a number, on/off, or one of its options. Returns the state read back.",
    "ha_call_service": "Call a Home Assistant service, e.g. domain 'switch', service 'turn_on', target "
    "{'entity_id': 'switch.pump'}.",
    "memory_search": "Search the farm's memory (this group's and the global notes, and chat history).",
    "memory_write": "Write this group's memory: path 'MEMORY.md' or 'memory/<topic>.md', mode append (default) "
    "or replace.",
    "send_message": "Send a text message to a chat (this group's chat id is in '## This run').",
    "schedule_task": "Run a prompt later: schedule_type cron ('0 6 * * *'), interval (ms), once (ISO-8601) or "
    'when (schedule_value {"entity": "sensor.x", "below": 25} or {"alert": "frost"}).',
}
# Parameters of the default tools a farm conversation rarely needs: left out of the offer, still accepted.
RARE_PARAMS: Final = {
    "schedule_task": frozenset({"groupFolder", "taskId", "context_mode"}),
    "memory_search": frozenset({"groupFolder", "topK", "sources"}),
}
_VALIDATION_ONLY: Final = frozenset(
    {
        "pattern",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "additionalProperties",
        "default",
    }
)
MAX_FOUND: Final = 8

_FIND_PARAMS: Final = obj(
    {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
    "query",
)
_USE_PARAMS: Final = obj(
    {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "arguments": {"type": "object", "additionalProperties": True},
    },
    "name",
)


@dataclass(frozen=True)
class Toolbox:
    """The tools of one group's run: the offered ones (in a fixed order) and every one it may call."""

    offered: tuple[ToolSpec, ...]
    usable: Mapping[str, ToolSpec]  # the group's tools, hidden or not, by name

    @classmethod
    def for_group(cls, tools: tuple[ToolSpec, ...]) -> Toolbox:
        """The box of a group's tools (`tools.tools_for`): DEFAULT_TOOLS it has, then find_tools and use_tool."""
        usable = {tool.name: tool for tool in tools}
        return cls(offered=tuple(usable[name] for name in DEFAULT_TOOLS if name in usable), usable=usable)

    def offered_names(self) -> tuple[str, ...]:
        """The names of the offered tools, in their order (find_tools and use_tool last)."""
        return (*(tool.name for tool in self.offered), FIND_TOOLS, USE_TOOL)

    def names(self) -> set[str]:
        """Every name a call may use in this run."""
        return {*self.usable, FIND_TOOLS, USE_TOOL}

    def params(self) -> list[dict[str, Any]]:
        """The offered tools in the chat-completions `tools` format, compact."""
        return [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": SHORT.get(tool.name, tool.description),
                    "parameters": _offered_parameters(tool),
                },
            }
            for tool in self.offered
        ] + [_META_FIND, _META_USE]

    def call(self, context: ToolContext, name: str, arguments: Mapping[str, Any]) -> ToolOutcome:
        """Run a call of the model: find_tools and use_tool here, any other of the group's tools as it is."""
        try:
            if name == FIND_TOOLS:
                query = check(_FIND_PARAMS, dict(arguments))["query"]
                return _ok({"tools": self.find(query)})
            if name == USE_TOOL:
                args = check(_USE_PARAMS, {k: v for k, v in arguments.items() if v is not None})
                inner = args["name"]
                if inner in (FIND_TOOLS, USE_TOOL) or inner not in self.usable:
                    raise InvalidRequestError(
                        f"there is no tool {inner!r} for this group; find_tools lists them (e.g. find_tools('dashboard'))"
                    )
                return call_tool(context, inner, args.get("arguments") or {})
        except FarmagentError as err:
            failure = {"errorCode": err.code, "error": err.message}
            return ToolOutcome(is_error=True, text=json.dumps(failure, ensure_ascii=False), value=failure)
        return call_tool(context, name, arguments)

    def find(self, query: str) -> list[dict[str, Any]]:
        """The group's tools whose name or description has every word of `query` (an exact name: that one)."""
        words = query.lower().replace("_", " ").split()
        exact = self.usable.get(query.strip())
        found = (
            [exact]
            if exact is not None
            else [
                tool
                for tool in self.usable.values()
                if all(w in f"{tool.name.replace('_', ' ')} {tool.description}".lower() for w in words)
            ]
        )
        if not found and words:  # any word, rather than nothing
            found = [t for t in self.usable.values() if any(w in t.name.replace("_", " ") for w in words)]
        return [
            {"name": t.name, "description": t.description, "parameters": compact(t.parameters)}
            for t in found[:MAX_FOUND]
        ]


def compact(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` without the keywords only validation needs (a call is checked against the full one)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _VALIDATION_ONLY:
            continue
        if key == "properties" and isinstance(value, Mapping):
            out[key] = {name: compact(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out[key] = compact(value)
        elif key == "anyOf" and isinstance(value, list):
            branches = [compact(branch) if isinstance(branch, Mapping) else branch for branch in value]
            if all(isinstance(b, dict) and set(b) == {"type"} and isinstance(b["type"], str) for b in branches):
                out["type"] = [b["type"] for b in branches]  # the same choice, shorter
            else:
                out[key] = branches
        elif key == "required" and not value:
            continue
        else:
            out[key] = value
    return out


def _offered_parameters(tool: ToolSpec) -> dict[str, Any]:
    # The names say enough in a small offer (entityId, chatJid, query); find_tools shows the host's texts.
    schema = compact(tool.parameters)
    rare = RARE_PARAMS.get(tool.name, frozenset())
    properties = {}
    for name, sub in schema.get("properties", {}).items():
        if name in rare:
            continue
        properties[name] = {key: value for key, value in sub.items() if key != "description"}
    return {**schema, "properties": properties}


def _ok(document: Any) -> ToolOutcome:
    return ToolOutcome(is_error=False, text=json.dumps(document, ensure_ascii=False), value=document)


_META_FIND: Final = {
    "type": "function",
    "function": {
        "name": FIND_TOOLS,
        "description": "Find more tools by a word (history, dashboard, screenshot, task, group, file, assist) or "
        "a name.",
        "parameters": compact(_FIND_PARAMS),
    },
}
_META_USE: Final = {
    "type": "function",
    "function": {
        "name": USE_TOOL,
        "description": "Call a tool find_tools found.",
        "parameters": compact(_USE_PARAMS),
    },
}
