"""The IPC wire format as the agent sees it: queues, request types, actions, error codes, names and deadlines.

farmagent must not import farmhost (it would pull the host's dependencies into every agent image), so the
closed sets of the contract (SPEC sections 4-6, docs/ipc.md, docs/schema/ipc-v1.schema.json) are written
here once more; tests/farmagent compares every one of them with the host's own definitions.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final


class Queue(StrEnum):
    """The agent -> host queue directories inside the group's IPC directory."""

    MESSAGES = "messages"
    TASKS = "tasks"
    ACTIONS = "actions"


class ErrorCode(StrEnum):
    """`errorCode` values the host writes into a result."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"
    CONFLICT = "conflict"
    EXPIRED = "expired"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_ERROR = "upstream_error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"
    RATE_LIMITED = "rate_limited"
    INTERNAL = "internal"


# Which queue each request `type` is written into.
QUEUE_OF_TYPE: Final[dict[str, Queue]] = {
    "message": Queue.MESSAGES,
    "file": Queue.MESSAGES,
    "schedule_task": Queue.TASKS,
    "pause_task": Queue.TASKS,
    "resume_task": Queue.TASKS,
    "cancel_task": Queue.TASKS,
    "refresh_groups": Queue.TASKS,
    "register_group": Queue.TASKS,
    "farm_action": Queue.ACTIONS,
    "ping": Queue.ACTIONS,
    "memory_action": Queue.ACTIONS,
}

FARM_ACTIONS: Final = (
    "ha_get_status",
    "ha_call_service",
    "ha_set_entity",
    "ha_restart",
    "ha_dashboard_get",
    "ha_dashboard_validate",
    "ha_dashboard_patch",
    "ha_apply_dashboard",
    "ha_capture_screenshot",
    "farm_state_refresh",
)
MEMORY_ACTIONS: Final = ("memory_search", "memory_get")

RESULTS_DIR: Final = "action_results"
CURRENT_TASKS: Final = "current_tasks.json"
AVAILABLE_GROUPS: Final = "available_groups.json"
HOST_STATUS: Final = "host_status.json"

REQUEST_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
FOLDER_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
CHAT_JID_RE: Final = re.compile(r"^[a-z][a-z0-9_-]*:\S+$")
DASHBOARD_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
ENTITY_ID_RE: Final = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")

# Client deadlines sit behind the host's own timeouts (30 s per handler, 35 s screenshots, 160 s ha_restart,
# plus the router's 2 s margin), so the host always answers `timeout` itself before the agent gives up.
DEFAULT_TIMEOUT: Final = 40.0
ACTION_TIMEOUTS: Final[dict[str, float]] = {"ha_capture_screenshot": 45.0, "ha_restart": 170.0}

# The host refreshes host_status.json every 5 s; three missed beats mean it is gone, not slow (docs/ipc.md).
STALE_HEARTBEAT_SECONDS: Final = 15.0


def request_id_problem(request_id: object) -> str | None:
    """Why `request_id` would be refused by the host, or None when it is valid."""
    if not isinstance(request_id, str) or not REQUEST_ID_RE.fullmatch(request_id):
        return (
            f"requestId {request_id!r} is not valid: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return None
