"""The IPC wire format, for both sides: queues, request types, error codes, names and deadlines.

The closed sets of the contract (SPEC sections 4-6, docs/ipc.md) are defined here once. Standard library only:
farmagent must not import farmhost (it would pull the host's dependencies into every agent image), so the host
imports these from here (`farmhost.protocol.codes`) instead of writing them again. The actions are the exception:
their rows live on the host (farmhost/protocol/catalog.py) and reach the sandbox in the exported contract and
tool table (`farmagent.tool_schemas`).
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
    PENDING_APPROVAL = "pending_approval"
    INTERNAL = "internal"


class Status(StrEnum):
    """`status` of a result."""

    SUCCESS = "success"
    ERROR = "error"


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

QUEUE_DIRS: Final = tuple(q.value for q in Queue)
RESULTS_DIR: Final = "action_results"
CURRENT_TASKS: Final = "current_tasks.json"
AVAILABLE_GROUPS: Final = "available_groups.json"
HOST_STATUS: Final = "host_status.json"

REQUEST_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
FOLDER_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
CHAT_JID_RE: Final = re.compile(r"^[a-z][a-z0-9_-]*:\S+$")
RESERVED_FOLDERS: Final = frozenset({"global", "errors"})
DASHBOARD_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
ENTITY_ID_RE: Final = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
# A site name (FARMHOST_SITE, a farm action's `site`) is one MQTT topic level and part of HA ids: no `/`, `+`, `#`.
SITE_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

# The client's wait for a result: behind the host's own 30 s per handler plus the router's 2 s margin, so the
# host always answers `timeout` itself before the agent gives up. An action with a longer timeout carries its
# own wait in the tool table (farmhost/protocol/catalog.py `client_timeout`).
DEFAULT_TIMEOUT: Final = 40.0
# A farm action for another site: the host waits for that site this long unless the request's ttl says less
# (a site restarting comes back within it); the client waits a little longer for the host's answer.
SITE_DEADLINE_SECONDS: Final = 120.0
SITE_TIMEOUT: Final = SITE_DEADLINE_SECONDS + 10.0

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


def folder_problem(folder: str) -> str | None:
    """Why `folder` is not a valid group folder name, or None when it is."""
    if not FOLDER_RE.fullmatch(folder):
        return f"folder {folder!r} is not valid: use 1-64 letters, digits, '_' or '-', starting with a letter or digit"
    if folder.lower() in RESERVED_FOLDERS:
        return f"folder {folder!r} is reserved; choose another name"
    return None
