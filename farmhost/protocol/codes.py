"""Closed sets of the IPC contract: queues, error codes, result statuses and name patterns."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final


class Queue(StrEnum):
    """The agent -> host queues inside a group's IPC directory."""

    MESSAGES = "messages"
    TASKS = "tasks"
    ACTIONS = "actions"


class ErrorCode(StrEnum):
    """`errorCode` values of a result; nothing else is ever written."""

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


class Status(StrEnum):
    """`status` of a result."""

    SUCCESS = "success"
    ERROR = "error"


RESULTS_DIR: Final = "action_results"
QUEUE_DIRS: Final = tuple(q.value for q in Queue)
REQUEST_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
FOLDER_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
RESERVED_FOLDERS: Final = frozenset({"global", "errors"})
DASHBOARD_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def folder_problem(folder: str) -> str | None:
    """Return why `folder` is not a valid group folder name, or None when it is."""
    if not FOLDER_RE.fullmatch(folder):
        return f"folder {folder!r} is not valid: use 1-64 letters, digits, '_' or '-', starting with a letter or digit"
    if folder.lower() in RESERVED_FOLDERS:
        return f"folder {folder!r} is reserved; choose another name"
    return None
