"""What a scheduled run is: the claimed run handed to the dispatcher, and the report it returns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from farmhost.store.tasks import Task

# The states a `task_runs` row can be in (docs/scheduler.md):
#   running      claimed, the agent run has not reported yet (never re-run: a crash turns it into `interrupted`)
#   ok, error, timeout   the dispatcher's report
#   interrupted  the host stopped (or died) while it ran
#   skipped      not run: missed by more than the grace, previous run still running, the group is gone, or (when)
#                within the cooldown or folded into a later event
RunStatus = Literal["running", "ok", "error", "timeout", "interrupted", "skipped"]
ReportStatus = Literal["ok", "error", "timeout", "interrupted", "skipped"]
FAILED: Final = frozenset({"error", "timeout"})
# What `task runs` and the failure alert show of an answer or error: enough to recognise it, small enough for a row.
SUMMARY_CHARS: Final = 500


@dataclass(frozen=True, kw_only=True)
class TaskRun:
    """A due time of a task, claimed in the database: dispatch it exactly once."""

    run_id: int
    task: Task
    due_at: datetime
    claimed_at: datetime


@dataclass(frozen=True, kw_only=True)
class RunReport:
    """How a dispatched run ended; `summary` is the agent's answer or the error (trimmed when stored)."""

    status: ReportStatus
    summary: str | None = None


Dispatch = Callable[[TaskRun], Awaitable[RunReport]]


def trim_summary(text: str | None, limit: int = SUMMARY_CHARS) -> str | None:
    """Keep the start of a long answer or error, marked as cut."""
    if text is None:
        return None
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
