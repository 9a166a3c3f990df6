"""The host <-> runner contract: AgentInput (one JSON object on stdin) and AgentResult (one JSON line on stdout).

Every run parses one AgentInput before anything else, so it is checked by the standard library (argcheck's
JSON Schema subset and `datetime.fromisoformat`) rather than a pydantic model, whose import and build cost
about 120 ms of each run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from farmagent.argcheck import checked, obj, summary
from farmagent.errors import FarmagentError
from farmagent.wire import FOLDER_RE, REQUEST_ID_RE

MAX_INPUT_BYTES: Final = 4 << 20  # a prompt, a few memory snippets: kilobytes; anything near this is a bug
MAX_TURNS_LIMIT: Final = 100
# The host's photo is a JPEG of at most 300 KB: 400 KB as base64; this leaves room and stops nothing of the host's.
MAX_IMAGE_URL_CHARS: Final = 1 << 20
_ZONE_RE: Final = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"  # an IANA name: no dots, so no `..` into the zone files


def _text(max_length: int, min_length: int = 0, pattern: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": min_length, "maxLength": max_length}
    if pattern is not None:
        schema["pattern"] = pattern
    return schema


_ID: Final = {"type": "string", "pattern": REQUEST_ID_RE.pattern}
_SNIPPET: Final = obj(
    {"citation": _text(1024), "groupFolder": _text(64), "snippet": _text(20_000)}, "citation", "groupFolder", "snippet"
)
_IMAGE: Final = obj(
    {"path": _text(256, min_length=1), "url": _text(MAX_IMAGE_URL_CHARS, pattern=r"^data:image/jpeg;base64,")},
    "path",
    "url",
)
SCHEMA: Final = obj(
    {
        "version": {"const": 1},
        "runId": _ID,
        "groupFolder": {"type": "string", "pattern": FOLDER_RE.pattern},
        "isMain": {"type": "boolean"},
        "prompt": _text(200_000, min_length=1),
        "scheduled": {"type": "boolean"},
        "taskId": {"anyOf": [_ID, {"type": "null"}]},
        "contextMode": {"enum": ["isolated", "group"]},
        "timezone": _text(64, min_length=1, pattern=_ZONE_RE),
        "now": _text(64, min_length=1),
        "chatJid": {"anyOf": [_text(256, min_length=3), {"type": "null"}]},
        "memory": {"type": "array", "maxItems": 64, "items": _SNIPPET},
        "maxTurns": {"type": "integer", "minimum": 1, "maximum": MAX_TURNS_LIMIT},
        "model": _text(200, min_length=1),
        "images": {"type": "array", "maxItems": 4, "items": _IMAGE},
    },
    *("version", "runId", "groupFolder", "isMain", "prompt", "scheduled", "contextMode", "timezone", "now"),
    *("maxTurns", "model"),
)


class InputError(FarmagentError, ValueError):
    """The AgentInput on stdin is missing, not JSON, or breaks the contract."""

    code = "invalid_input"


@dataclass(frozen=True, kw_only=True)
class MemorySnippet:
    """One memory hit the host found for the prompt."""

    citation: str
    groupFolder: str
    snippet: str


@dataclass(frozen=True, kw_only=True)
class ImageInput:
    """A photo the host attached to the run: where it is in the workspace, and the downscaled JPEG as a data URL."""

    path: str
    url: str


@dataclass(frozen=True, kw_only=True)
class AgentInput:
    """What the host asks of one run (docs: container/README.md "The runner contract")."""

    version: Literal[1]
    runId: str
    groupFolder: str
    isMain: bool
    prompt: str
    scheduled: bool
    taskId: str | None = None
    contextMode: Literal["isolated", "group"]
    timezone: str
    now: datetime
    chatJid: str | None = None
    memory: list[MemorySnippet] = field(default_factory=list)
    maxTurns: int
    model: str
    images: list[ImageInput] = field(default_factory=list)  # for a model that can see: image parts of the prompt


def parse_input(raw: bytes) -> AgentInput:
    """Parse and validate the AgentInput.

    Raises:
        InputError: with a sentence naming every broken field (at most five).
    """
    if len(raw) > MAX_INPUT_BYTES:
        raise InputError(f"the AgentInput is over the {MAX_INPUT_BYTES}-byte limit")
    if not raw.strip():
        raise InputError("no AgentInput on stdin: expected one JSON object")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"the AgentInput is not valid JSON: {err}") from None
    if not isinstance(document, dict):
        raise InputError("the AgentInput must be a JSON object")
    document, problems = checked(SCHEMA, document, "AgentInput")
    now: datetime | None = None
    if isinstance(document.get("now"), str):
        now, problem = _aware(document["now"])
        problems += [problem] if problem else []
    if problems or now is None:
        raise InputError(f"the AgentInput breaks the contract: {summary(problems)}")
    fields = {
        **document,
        "now": now,
        "memory": [MemorySnippet(**hit) for hit in document.get("memory", [])],
        "images": [ImageInput(**image) for image in document.get("images", [])],
    }
    return AgentInput(**fields)


def _aware(text: str) -> tuple[datetime | None, str | None]:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None, f"AgentInput.now must be an ISO 8601 date and time (got {text[:40]!r})"
    if when.tzinfo is None or when.utcoffset() is None:
        return None, f"AgentInput.now must have a time zone offset (got {text[:40]!r})"
    return when, None


@dataclass(frozen=True, kw_only=True)
class AgentResult:
    """The one line the runner prints on stdout."""

    status: Literal["ok", "error"]
    answer: str | None = None
    error: str | None = None
    turns: int = 0
    toolCalls: int = 0

    def to_json(self) -> str:
        """The line, without a newline."""
        document: dict[str, Any] = {
            "status": self.status,
            "answer": self.answer,
            "error": self.error,
            "turns": self.turns,
            "toolCalls": self.toolCalls,
        }
        return json.dumps(document, ensure_ascii=False)


def local_now(agent_input: AgentInput) -> tuple[datetime, str]:
    """`now` in the farm's zone and a note when the zone is unknown here (then UTC is used)."""
    try:
        return agent_input.now.astimezone(ZoneInfo(agent_input.timezone)), ""
    except (ZoneInfoNotFoundError, ValueError):
        return agent_input.now, f" (zone data for {agent_input.timezone} is missing in this sandbox; times are UTC)"
