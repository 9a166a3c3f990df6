"""The closed sets of the IPC contract as the host uses them: defined once, in the agent package's wire module.

`farmagent.wire` is standard library only and installs with farmhost, so both sides read the same definitions.
The action names are not among them: they come from the rows of farmhost/protocol/catalog.py.
"""

from __future__ import annotations

from farmagent.wire import (
    AVAILABLE_GROUPS,
    CHAT_JID_RE,
    CURRENT_TASKS,
    DASHBOARD_RE,
    ENTITY_ID_RE,
    FOLDER_RE,
    HOST_STATUS,
    QUEUE_DIRS,
    QUEUE_OF_TYPE,
    REQUEST_ID_RE,
    RESERVED_FOLDERS,
    RESULTS_DIR,
    SITE_DEADLINE_SECONDS,
    SITE_RE,
    ErrorCode,
    Queue,
    Status,
    folder_problem,
)

__all__ = [
    "AVAILABLE_GROUPS",
    "CHAT_JID_RE",
    "CURRENT_TASKS",
    "DASHBOARD_RE",
    "ENTITY_ID_RE",
    "FOLDER_RE",
    "HOST_STATUS",
    "QUEUE_DIRS",
    "QUEUE_OF_TYPE",
    "REQUEST_ID_RE",
    "RESERVED_FOLDERS",
    "RESULTS_DIR",
    "SITE_DEADLINE_SECONDS",
    "SITE_RE",
    "ErrorCode",
    "Queue",
    "Status",
    "folder_problem",
]
