"""The JSON Schema of the whole IPC contract, exported by `farmhost schema` into docs/schema/."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from farmhost.protocol.codes import ErrorCode, Status
from farmhost.protocol.requests import ActionsRequest, MessagesRequest, TasksRequest

SCHEMA_ID = "https://farmhost.invalid/schema/ipc-v1.json"


def result_schema() -> dict[str, Any]:
    """The result envelope written to `action_results/<requestId>.json`."""
    return {
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
    """One document: a schema per queue (`messages`, `tasks`, `actions`) and the result envelope."""
    queues = {
        "messages": TypeAdapter(MessagesRequest).json_schema(mode="validation"),
        "tasks": TypeAdapter(TasksRequest).json_schema(mode="validation"),
        "actions": TypeAdapter(ActionsRequest).json_schema(mode="validation"),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "farmhost IPC contract v1",
        "description": "Requests an agent writes to ipc/<folder>/<queue>/*.json and the result the host writes back.",
        "queues": queues,
        "result": result_schema(),
    }
