"""The JSON Schema of the whole IPC contract, exported by `farmhost schema` into docs/schema/."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from farmhost.protocol.codes import ErrorCode, Status
from farmhost.protocol.requests import ActionsRequest, MessagesRequest, TasksRequest

SCHEMA_ID = "https://farmhost.invalid/schema/ipc-v1.json"

# Name of each queue's union in `$defs`; `queues` maps the queue directory to it.
QUEUE_DEFS: dict[str, tuple[str, Any]] = {
    "messages": ("MessagesRequest", MessagesRequest),
    "tasks": ("TasksRequest", TasksRequest),
    "actions": ("ActionsRequest", ActionsRequest),
}
RESULT_DEF = "Result"


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
        schema = TypeAdapter(union).json_schema(mode="validation")
        for name, definition in schema.pop("$defs", {}).items():
            if defs.setdefault(name, definition) != definition:
                raise ValueError(f"two request models are both called {name!r}")
        defs[union_name] = schema
    defs[RESULT_DEF] = result_schema()
    refs = {queue: {"$ref": f"#/$defs/{union_name}"} for queue, (union_name, _) in QUEUE_DEFS.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "farmhost IPC contract v1",
        "description": (
            "Requests an agent writes to ipc/<folder>/<queue>/*.json and the result the host writes back. "
            "Validate a request against queues.<queue> (messages, tasks, actions), a result against result."
        ),
        "anyOf": [*refs.values(), {"$ref": f"#/$defs/{RESULT_DEF}"}],
        "queues": refs,
        "result": {"$ref": f"#/$defs/{RESULT_DEF}"},
        "$defs": defs,
    }
