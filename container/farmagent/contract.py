"""The host <-> runner contract: AgentInput (one JSON object on stdin) and AgentResult (one JSON line on stdout)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from farmagent.errors import FarmagentError
from farmagent.wire import FOLDER_RE, REQUEST_ID_RE

MAX_INPUT_BYTES: Final = 4 << 20  # a prompt, a few memory snippets: kilobytes; anything near this is a bug
MAX_TURNS_LIMIT: Final = 100
_ZONE_RE: Final = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"

_Id = Annotated[str, StringConstraints(pattern=REQUEST_ID_RE.pattern)]


class InputError(FarmagentError, ValueError):
    """The AgentInput on stdin is missing, not JSON, or breaks the contract."""

    code = "invalid_input"


class MemorySnippet(BaseModel):
    """One memory hit the host found for the prompt."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    citation: Annotated[str, StringConstraints(max_length=1024)]
    groupFolder: Annotated[str, StringConstraints(max_length=64)]
    snippet: Annotated[str, StringConstraints(max_length=20_000)]


class AgentInput(BaseModel):
    """What the host asks of one run (docs: container/README.md "The runner contract")."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: Literal[1]
    runId: _Id
    groupFolder: Annotated[str, StringConstraints(pattern=FOLDER_RE.pattern)]
    isMain: bool
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=200_000)]
    scheduled: bool
    taskId: _Id | None = None
    contextMode: Literal["isolated", "group"]
    timezone: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_ZONE_RE)]
    now: AwareDatetime
    chatJid: Annotated[str, StringConstraints(min_length=3, max_length=256)] | None = None
    memory: Annotated[list[MemorySnippet], Field(max_length=64)] = []
    maxTurns: Annotated[int, Field(ge=1, le=MAX_TURNS_LIMIT)]
    model: Annotated[str, StringConstraints(min_length=1, max_length=200)]

    @field_validator("timezone")
    @classmethod
    def _no_dot_segments(cls, value: str) -> str:
        if ".." in value.split("/"):
            raise ValueError("must be an IANA zone name such as Europe/Amsterdam")
        return value


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
    try:
        return AgentInput.model_validate_json(raw)
    except ValidationError as err:
        missing = [_where(e["loc"]) for e in err.errors() if e["type"] == "missing"]
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"{_where(e['loc'])}: {e['msg']}" for e in err.errors() if e["type"] != "missing"]
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise InputError(f"the AgentInput breaks the contract: {shown}") from None


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "input"


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
