"""The JSON Schema of the whole IPC contract and the sandbox's tool table, exported by `farmhost schema`.

The agent package carries the same contract (`farmagent/ipc_contract.json`, also docs/schema/) and the tool table
(`farmagent/tool_table.json`, `farmhost schema --tools`): its tools are generated from the table's rows, their
parameters from `actions` (every action's params) and `requests` (every request type) in the contract.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import TypeAdapter

from farmhost.protocol.catalog import (
    ACTION_PARAMS,
    FARM_ROWS,
    MEMORY_ROWS,
    REQUESTS,
    ActionRow,
    Tool,
    client_timeout,
)
from farmhost.protocol.codes import ErrorCode, Status
from farmhost.protocol.requests import ActionsRequest, AnyRequest, MessagesRequest, TasksRequest

SCHEMA_ID = "https://farmhost.invalid/schema/ipc-v1.json"

# Name of each queue's union in `$defs`; `queues` maps the queue directory to it.
QUEUE_DEFS: dict[str, tuple[str, Any]] = {
    "messages": ("MessagesRequest", MessagesRequest),
    "tasks": ("TasksRequest", TasksRequest),
    "actions": ("ActionsRequest", ActionsRequest),
}
RESULT_DEF = "Result"
# The request models whose `params` depend on their `action`.
ACTION_REQUEST_DEFS = {"FarmActionRequest", "MemoryActionRequest"}


def result_schema() -> dict[str, Any]:
    """The result envelope written to `action_results/<requestId>.json`."""
    return {
        "title": "Result",
        "description": "What the host writes to action_results/<requestId>.json for every request.",
        "type": "object",
        "additionalProperties": False,
        "required": [
            "requestId",
            "type",
            "action",
            "status",
            "result",
            "error",
            "errorCode",
            "executedAt",
            "durationMs",
        ],
        "properties": {
            "requestId": {"type": "string"},
            "type": {"type": "string"},
            "action": {"type": ["string", "null"]},
            "status": {"enum": [s.value for s in Status]},
            "result": {},
            "error": {"type": ["string", "null"]},
            "errorCode": {"enum": [*(c.value for c in ErrorCode), None]},
            "executedAt": {"type": "string", "format": "date-time"},
            "durationMs": {"type": "integer", "minimum": 0},
        },
    }


def contract_schema() -> dict[str, Any]:
    """One self-contained document: every definition in the root `$defs`, one union per queue, the result.

    `queues.<queue>` and `result` are `$ref`s into `$defs`; the root itself accepts any request or result.
    pydantic writes its references as `#/$defs/<Model>`, so the models' definitions must live in the root
    `$defs` for those references to resolve.

    Raises:
        ValueError: two queues define different models under the same name.
    """
    defs: dict[str, Any] = {}
    for union_name, union in QUEUE_DEFS.values():
        defs[union_name] = _merge_defs(defs, TypeAdapter(union).json_schema(mode="validation"))
    actions = {}
    for action, model in ACTION_PARAMS.items():
        defs[model.__name__] = _merge_defs(defs, model.model_json_schema(mode="validation"))
        actions[action] = {"$ref": f"#/$defs/{model.__name__}"}
    for name in ACTION_REQUEST_DEFS:
        choices = defs[name]["properties"]["action"]
        names = choices.get("enum") or [choices["const"]]
        defs[name]["allOf"] = [
            {"if": {"properties": {"action": {"const": a}}}, "then": {"properties": {"params": actions[a]}}}
            for a in names
        ]
    defs[RESULT_DEF] = result_schema()
    refs = {queue: {"$ref": f"#/$defs/{union_name}"} for queue, (union_name, _) in QUEUE_DEFS.items()}
    requests = {
        kind: {"$ref": f"#/$defs/{model.__name__}"}
        for model in get_args(AnyRequest)
        for kind in get_args(model.model_fields["type"].annotation)
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "farmhost IPC contract v1",
        "description": (
            "Requests an agent writes to ipc/<folder>/<queue>/*.json and the result the host writes back. "
            "Validate a request against queues.<queue> (messages, tasks, actions), a result against result; "
            "requests.<type> is each request type's model and actions.<action> each action's params."
        ),
        "anyOf": [*refs.values(), {"$ref": f"#/$defs/{RESULT_DEF}"}],
        "queues": refs,
        "requests": requests,
        "actions": actions,
        "result": {"$ref": f"#/$defs/{RESULT_DEF}"},
        "$defs": defs,
    }


def tool_table() -> dict[str, Any]:
    """The sandbox's tools that reach the host, one entry per request row and action row, in the rows' order.

    `request` is the request type a call writes; `action` the action, for farm and memory actions; `fields` the
    request's fields a request tool offers (an action tool offers all its params); `timeout` the client's wait
    when the action's own default is not enough (else null).
    """
    tools = [_tool_entry(row.tool, row.type, fields=row.fields) for row in REQUESTS]
    tools += [_tool_entry(row.tool, "memory_action", action=row) for row in MEMORY_ROWS]
    tools += [_tool_entry(row.tool, "farm_action", action=row) for row in FARM_ROWS]
    return {
        "description": "Generated by `farmhost schema --tools` from farmhost/protocol/catalog.py; do not edit.",
        "tools": tools,
    }


def _tool_entry(
    tool: Tool, request: str, *, fields: tuple[str, ...] = (), action: ActionRow | None = None
) -> dict[str, Any]:
    hints = tool.hints
    return {
        "name": tool.name or (action.name if action else request),
        "request": request,
        "action": action.name if action else None,
        "fields": list(fields),
        "description": tool.description,
        "hints": {
            "readOnly": hints.read_only,
            "destructive": hints.destructive,
            "idempotent": hints.idempotent,
            "openWorld": hints.open_world,
        },
        "result": tool.result,
        "mainOnly": tool.main_only,
        "timeout": client_timeout(action) if action else None,
    }


def _merge_defs(defs: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Move `schema`'s own `$defs` into the shared `defs` and return the rest of it.

    Raises:
        ValueError: two different models share a name.
    """
    for name, definition in schema.pop("$defs", {}).items():
        if defs.setdefault(name, definition) != definition:
            raise ValueError(f"two contract models are both called {name!r}")
    return schema
