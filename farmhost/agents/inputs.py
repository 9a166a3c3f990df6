"""The agent contract on the host side: the AgentInput written to stdin, the AgentResult read from stdout."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farmhost.agents.jobs import AgentJob
from farmhost.agents.photos import PreparedPhoto
from farmhost.protocol.envelope import utc_stamp

INPUT_VERSION: Final = 1
# A snippet cut shorter than this tells the agent nothing; the budget left is dropped instead.
MIN_SNIPPET_CHARS: Final = 40
ELLIPSIS: Final = "…"


def trim_memory(hits: Sequence[dict[str, Any]], budget: int) -> list[dict[str, str]]:
    """The memory hits, best first, as `{citation, groupFolder, snippet}` within `budget` characters.

    The budget counts the citation and the snippet of each hit; the last one that fits only in part is cut.
    """
    memory: list[dict[str, str]] = []
    left = budget
    for hit in hits:
        snippet = str(hit.get("snippet") or "").strip()
        if not snippet:
            continue
        citation = _citation(hit)
        room = left - len(citation)
        if room < min(MIN_SNIPPET_CHARS, len(snippet)):
            break
        if len(snippet) > room:
            snippet = snippet[: room - len(ELLIPSIS)].rstrip() + ELLIPSIS
        memory.append({"citation": citation, "groupFolder": str(hit.get("groupFolder") or ""), "snippet": snippet})
        left -= len(citation) + len(snippet)
    return memory


def _citation(hit: dict[str, Any]) -> str:
    if hit.get("citation"):
        return str(hit["citation"])
    if hit.get("source") == "session":  # a chat message: who said it, where and when
        return f"{hit.get('sender') or '?'} in {hit.get('chatJid') or '?'} at {hit.get('timestamp') or '?'}"
    return str(hit.get("path") or "")


def with_notes(job: AgentJob, notes: list[str]) -> AgentJob:
    """The job with the host's notes before its prompt (unchanged without notes)."""
    if not notes:
        return job
    lines = "\n".join(f"- {note}" for note in notes)
    return replace(job, prompt=f"[farmhost: since your last run]\n{lines}\n\n{job.prompt}")


def agent_input(
    job: AgentJob,
    *,
    is_main: bool,
    timezone: str,
    now: datetime,
    memory: list[dict[str, str]],
    max_turns: int,
    model: str,
    images: Sequence[PreparedPhoto] = (),
) -> dict[str, Any]:
    """The AgentInput document of the contract (docs/agent-runtime.md); `images`: the photos attached to the run."""
    document: dict[str, Any] = {
        "version": INPUT_VERSION,
        "runId": job.run_id,
        "groupFolder": job.folder,
        "isMain": is_main,
        "prompt": job.prompt,
        "scheduled": job.scheduled,
        "taskId": job.task_id,
        "contextMode": job.context_mode,
        "timezone": timezone,
        "now": utc_stamp(now),
        "chatJid": job.chat_jid,
        "memory": memory,
        "maxTurns": max_turns,
        "model": model,
    }
    if images:  # absent without a photo: a runner older than images still runs every other job
        document["images"] = [{"path": photo.path, "url": photo.data_url} for photo in images]
    return document


class AgentResult(BaseModel):
    """The one JSON object the agent prints on its last stdout line."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["ok", "error"]
    answer: str | None = None
    error: str | None = None
    turns: int = Field(default=0, ge=0)
    toolCalls: int = Field(default=0, ge=0)  # the wire's camelCase name


def parse_result(line: str | None) -> AgentResult | str:
    """The AgentResult on `line`, or a sentence saying why there is none."""
    if line is None:
        return "agent printed no result"
    try:
        document = json.loads(line)
    except ValueError:
        return "agent printed no result (its last output line is not JSON)"
    if not isinstance(document, dict):
        return "agent printed no result (its last output line is not a JSON object)"
    try:
        return AgentResult.model_validate(document)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"]) or "result"
        return f"agent printed no result (its last output line is not a valid result: {field}: {first['msg']})"
