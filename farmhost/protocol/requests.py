"""Pydantic models of every request an agent may write, one discriminated union per queue."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from farmhost.protocol.catalog import FarmActionName, MemoryActionName
from farmhost.protocol.codes import (
    CHAT_JID_RE,
    DASHBOARD_RE,
    FOLDER_RE,
    QUEUE_OF_TYPE,
    REQUEST_ID_RE,
    SITE_RE,
    Queue,
    folder_problem,
)

RequestId = Annotated[str, StringConstraints(pattern=REQUEST_ID_RE.pattern)]
FolderName = Annotated[str, StringConstraints(pattern=FOLDER_RE.pattern)]
DashboardName = Annotated[str, StringConstraints(pattern=DASHBOARD_RE.pattern)]
ChatJid = Annotated[
    str,
    StringConstraints(min_length=3, max_length=256, pattern=CHAT_JID_RE.pattern),
    Field(description="chat id, e.g. telegram:-1001234"),
]

_NUL_PROBLEM: Final = "contains a NUL character (\\u0000); remove it, no chat, task or Home Assistant can use it"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(_NUL_PROBLEM)
    return value


def _no_nul_inside(value: dict[str, Any]) -> dict[str, Any]:
    """Refuse NUL in any string of a params document (keys too), without recursion: depth is the agent's."""
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            _no_nul(item)
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return value


# Text that reaches Telegram, the database, an agent's prompt or Home Assistant.
NoNul = AfterValidator(_no_nul)
Params = Annotated[dict[str, Any], AfterValidator(_no_nul_inside)]

MAX_TEXT_CHARS: Final = 65_536  # a message over 16 Telegram chunks is a runaway agent, not a reply
MAX_PROMPT_CHARS: Final = 16_384


class _Request(BaseModel):
    """Fields every request may carry; `groupFolder`/`timestamp` are accepted but never establish identity."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    requestId: RequestId | None = None
    ttl: Annotated[float, Field(gt=0, le=86_400)] | None = None
    expiresAt: AwareDatetime | None = None
    timestamp: str | float | None = None

    def expires_at(self, received_at: datetime) -> datetime | None:
        """When the request stops being worth executing, from `ttl` (counted from receipt) or `expiresAt`."""
        candidates = [self.expiresAt] if self.expiresAt is not None else []
        if self.ttl is not None:
            candidates.append(received_at + timedelta(seconds=self.ttl))
        return min(candidates) if candidates else None

    @property
    def action_name(self) -> str | None:
        """The `action` of the result envelope (None for requests without one)."""
        return None


# messages/ ---------------------------------------------------------------------------------------


class MessageRequest(_Request):
    """Send text to a chat."""

    type: Literal["message"]
    chatJid: ChatJid
    text: Annotated[
        str, StringConstraints(min_length=1, max_length=MAX_TEXT_CHARS), NoNul, Field(description="the message")
    ]
    groupFolder: str | None = None


class FileRequest(_Request):
    """Send a file from the group's own workspace to a chat."""

    type: Literal["file"]
    chatJid: ChatJid
    path: Annotated[
        str,
        StringConstraints(min_length=1, max_length=1024),
        Field(description="relative to the group's workspace, e.g. screenshots/x.png"),
    ]
    caption: (
        Annotated[str, StringConstraints(max_length=1024), NoNul, Field(description="text shown with the file")] | None
    ) = None
    groupFolder: str | None = None


# tasks/ ------------------------------------------------------------------------------------------


class ScheduleTaskRequest(_Request):
    """Create a cron/interval/once/when task."""

    type: Literal["schedule_task"]
    prompt: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS),
        NoNul,
        Field(description="what the agent is asked when the task runs"),
    ]
    schedule_type: Annotated[
        Literal["cron", "interval", "once", "when"],
        Field(description="kind of schedule: a clock (cron, interval, once) or a farm event (when)"),
    ]
    schedule_value: Annotated[
        Annotated[str, StringConstraints(min_length=1, max_length=200), NoNul] | int | Params,
        Field(
            description=(
                "cron expression (5 fields), interval in ms (at least 1000), or ISO-8601 time; for when, a JSON "
                'object (not a string): {"entity": "sensor.field_1_soil_moisture", "below": 25, "for": 600} '
                '(above/below/state, optional for seconds) or {"alert": "frost"}, plus optional cooldown seconds '
                "(default 3600)"
            )
        ),
    ]
    context_mode: Annotated[
        Literal["isolated", "group"],
        Field(description="'group' continues the group's conversation, 'isolated' starts fresh"),
    ] = "isolated"
    groupFolder: Annotated[
        FolderName | None, Field(description="another group to schedule for (main only); default this group")
    ] = None
    taskId: Annotated[RequestId | None, Field(description="choose the task's id; default a new one")] = None


class TaskIdRequest(_Request):
    """Pause, resume or cancel one task."""

    type: Literal["pause_task", "resume_task", "cancel_task"]
    taskId: Annotated[RequestId, Field(description="the task's id (see list_tasks)")]
    groupFolder: str | None = None


class RefreshGroupsRequest(_Request):
    """Re-read the chats and rewrite `available_groups.json` (main only)."""

    type: Literal["refresh_groups"]
    groupFolder: str | None = None


class RegisterGroupRequest(_Request):
    """Register a chat as a group (main only); `isMain` is refused by name."""

    type: Literal["register_group"]
    jid: ChatJid
    name: Annotated[str, StringConstraints(min_length=1, max_length=200), NoNul, Field(description="display name")]
    # The pattern is for the exported schema only: `_folder_is_valid` checks it with the contract's own message.
    folder: Annotated[
        str,
        StringConstraints(min_length=1, max_length=64),
        Field(
            description="the new group's workspace folder; not 'global' or 'errors'",
            json_schema_extra={"pattern": FOLDER_RE.pattern},
        ),
    ]
    trigger: (
        Annotated[str, StringConstraints(min_length=1, max_length=100), NoNul, Field(description="e.g. @farm")] | None
    ) = None
    requiresTrigger: Annotated[bool, Field(description="answer only messages with the trigger")] = True
    groupFolder: str | None = None

    @field_validator("folder")
    @classmethod
    def _folder_is_valid(cls, value: str) -> str:
        problem = folder_problem(value)
        if problem:
            raise ValueError(problem)
        return value


# actions/ ----------------------------------------------------------------------------------------


class FarmActionRequest(_Request):
    """A Home Assistant / farm action; its params are checked by its model (farmhost.protocol.params)."""

    type: Literal["farm_action"]
    action: FarmActionName
    params: Params = Field(default_factory=dict)
    groupFolder: str | None = None
    site: (
        Annotated[
            str,
            StringConstraints(pattern=SITE_RE.pattern),
            Field(description="another farmhost on the same MQTT broker that runs the action (main group only)"),
        ]
        | None
    ) = None

    @property
    def action_name(self) -> str | None:
        """The farm action's name."""
        return self.action


class PingRequest(_Request):
    """The cheapest request: proves the host answers."""

    type: Literal["ping"]
    groupFolder: str | None = None


class MemoryActionRequest(_Request):
    """memory_search / memory_get over markdown memory and transcripts."""

    type: Literal["memory_action"]
    action: MemoryActionName
    params: Params = Field(default_factory=dict)
    groupFolder: str | None = None

    @property
    def action_name(self) -> str | None:
        """The memory action's name."""
        return self.action


MessagesRequest = Annotated[MessageRequest | FileRequest, Field(discriminator="type")]
TasksRequest = Annotated[
    ScheduleTaskRequest | TaskIdRequest | RefreshGroupsRequest | RegisterGroupRequest, Field(discriminator="type")
]
ActionsRequest = Annotated[FarmActionRequest | PingRequest | MemoryActionRequest, Field(discriminator="type")]
AnyRequest = (
    MessageRequest
    | FileRequest
    | ScheduleTaskRequest
    | TaskIdRequest
    | RefreshGroupsRequest
    | RegisterGroupRequest
    | FarmActionRequest
    | PingRequest
    | MemoryActionRequest
)

QUEUE_TYPES: Final[dict[Queue, tuple[str, ...]]] = {
    queue: tuple(kind for kind, home in QUEUE_OF_TYPE.items() if home is queue) for queue in Queue
}
