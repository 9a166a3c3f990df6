"""AgentJob and AgentOutcome: what callers submit to the agent runtime and what they get back."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from farmhost.protocol.codes import FOLDER_RE

# Run ids name log files and containers: no path characters, and sortable by start time when generated.
RUN_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONTEXT_MODES: Final = ("isolated", "group")
# A chat photo is a file the host saved in the workspace's inbox/: one name, never a way out of it.
PHOTO_RE: Final = re.compile(r"^inbox/[A-Za-z0-9][A-Za-z0-9_.-]{0,159}$")

Status = Literal["ok", "error", "timeout", "cancelled"]


def new_run_id() -> str:
    """A unique run id that sorts by start time, e.g. `20260517T101112-1a2b3c4d`."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class AgentJob:
    """One agent run to do: the group, the prompt and where it comes from (a scheduled task or a chat)."""

    folder: str
    prompt: str
    scheduled: bool
    context_mode: str = "isolated"
    task_id: str | None = None
    chat_jid: str | None = None
    run_id: str = field(default_factory=new_run_id)
    message: str | None = None  # a chat job: the farmer's own words (Assist hears these when no LLM answers)
    photo: str | None = None  # a chat job for a photo: its file in the workspace (a model that can see gets it)

    def __post_init__(self) -> None:
        if not FOLDER_RE.fullmatch(self.folder):
            raise ValueError(f"invalid group folder {self.folder!r}")
        if not RUN_ID_RE.fullmatch(self.run_id):
            raise ValueError(f"invalid run id {self.run_id!r} (letters, digits, '_', '.', '-'; at most 64)")
        if self.context_mode not in CONTEXT_MODES:
            raise ValueError(f"context_mode must be 'isolated' or 'group', not {self.context_mode!r}")
        if self.photo is not None and not PHOTO_RE.fullmatch(self.photo):
            raise ValueError(f"invalid photo {self.photo!r} (a file name in inbox/)")


@dataclass(frozen=True)
class AgentOutcome:
    """How a run ended; `answer` is the agent's final answer when `status` is `ok`."""

    run_id: str
    status: Status
    answer: str | None
    error: str | None
    duration_seconds: float
    exit_code: int | None
    log_path: Path
    answered_by: str | None = None  # "assist" when Home Assistant's Assist answered instead of an LLM
    fallback_why: str | None = None  # why it did ("no LLM is configured", ...), for the chat's one-time notice
    receipt: str | None = None  # what farmhost saw the run change in HA (farm/state/receipts.py); None: nothing
    photo_note: str | None = None  # why the model did not see the job's photo, for the chat; None: it did, or none
    # Where the host's time went, in ms, in order (hook, memory, sandbox, agent, cleanup, log): the run log and
    # bench/agent_run.py show it.
    phases_ms: dict[str, float] = field(default_factory=dict)
