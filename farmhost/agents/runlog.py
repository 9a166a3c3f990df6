"""Per-run log files, the host's: `logs/runs/<folder>/run-<runId>.log` in the data dir, outside every sandbox mount."""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
import time
from pathlib import Path
from typing import Final

from farmhost.agents.inputs import AgentResult
from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.launch import Exit
from farmhost.agents.proxy.budget import ProxyUsage
from farmhost.agents.sandbox.backends.base import RunLimits
from farmhost.files import DIR_FLAGS, temp_target, write_atomic
from farmhost.store.db import iso, now_utc
from farmhost.store.groups import Group

# The log keeps the prompt for reference; a pasted document need not be kept whole.
PROMPT_LOG_CHARS: Final = 2000
# Enough history to look back over a few weeks of hourly tasks; each log is at most ~2x the output cap.
RUN_LOGS_KEPT: Final = 200
# The operator (and the daemon's group) may read them; no sandbox sees the directory at all.
LOGS_MODE: Final = 0o750
# A log's temp file this old was left by a daemon killed while writing it (another run's log takes milliseconds).
STALE_TEMP_SECONDS: Final = 3600


def log_name(run_id: str) -> str:
    """The file name of a run's log."""
    return f"run-{run_id}.log"


def write_run_log_sync(directory: Path, run_id: str, text: str) -> Path:
    """Write `run-<runId>.log` in the group's log `directory` and prune the oldest logs (blocking; use a thread).

    Returns:
        The log file's path.
    """
    directory.mkdir(mode=LOGS_MODE, parents=True, exist_ok=True)
    fd = os.open(directory, DIR_FLAGS)
    try:
        # Whole or not at all under its name: an operator's `tail` or a waiting reader never opens it half written.
        write_atomic(fd, log_name(run_id), text.encode(errors="replace"), mode=0o640)
        _prune(fd)
    finally:
        os.close(fd)
    return directory / log_name(run_id)


def _is_log(name: str) -> bool:
    return name.startswith("run-") and name.endswith(".log")


def _prune(directory: int) -> None:
    """Keep the newest RUN_LOGS_KEPT logs; drop the temp file of a log whose writer died (kill -9) mid-write."""
    logs = []
    stale = time.time() - STALE_TEMP_SECONDS
    for name in os.listdir(directory):
        target = temp_target(name)
        if not _is_log(name) and not (target is not None and _is_log(target)):
            continue
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if target is None:
            logs.append((info.st_mtime_ns, name))
        elif info.st_mtime < stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=directory)
    for _, name in sorted(logs)[:-RUN_LOGS_KEPT]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=directory)


class RunRecord:
    """What the run log says about one run."""

    def __init__(self, *, job: AgentJob, group: Group, limits: RunLimits, backend: str, memory: int) -> None:
        self.job = job
        self.group = group
        self.limits = limits
        self.backend = backend
        self.memory = memory
        self.started_at = now_utc()
        self.command: tuple[str, ...] = ()
        self.usage: ProxyUsage | None = None
        self.exit: Exit | None = None
        self.result: AgentResult | None = None
        self.out_of_memory = False  # the kernel killed one of its processes at the cgroup memory limit
        self.photo: str | None = None  # what became of the job's photo (attached, or why not)
        self.phases_ms: dict[str, float] = {}  # the host's phases so far (AgentOutcome.phases_ms)

    def phase(self, name: str, start: float, end: float | None = None) -> float:
        """Record that phase `name` took from `start` to `end` (time.monotonic(), default now); returns `end`."""
        end = time.monotonic() if end is None else end
        self.phases_ms[name] = round((end - start) * 1000, 2)
        return end

    @property
    def kind(self) -> str:
        """Scheduled (with its task) or chat."""
        job = self.job
        if job.scheduled:
            return f"scheduled task {job.task_id}" if job.task_id else "scheduled"
        return f"chat {job.chat_jid}" if job.chat_jid else "chat"

    def render(self, outcome: AgentOutcome) -> str:
        """The log file's text: the input summary, the command, how it ended and the captured output."""
        job, limits = self.job, self.limits
        prompt = job.prompt if len(job.prompt) <= PROMPT_LOG_CHARS else job.prompt[:PROMPT_LOG_CHARS] + " [...]"
        lines = [
            f"run {job.run_id} of group {job.folder}{' (main)' if self.group.is_main else ''}",
            f"started {iso(self.started_at)}, {outcome.duration_seconds:.2f} s",
            f"job: {self.kind}, context {job.context_mode}",
            (
                f"limits: {limits.timeout_seconds:g} s, {limits.memory_mb} MB, {limits.pids} processes, "
                f"{limits.max_turns} turns"
            ),
            f"memory snippets: {self.memory}",
            *([f"photo: {self.photo}"] if self.photo else []),
            f"runtime: {self.backend}",
            f"command: {shlex.join(self.command) if self.command else '(not started)'}",
            f"status: {outcome.status}, exit code {outcome.exit_code}",
        ]
        if outcome.error:
            lines.append(f"error: {outcome.error}")
        if self.result is not None:
            lines.append(f"agent: {self.result.turns} turn(s), {self.result.toolCalls} tool call(s)")
        if outcome.phases_ms:
            lines.append("host: " + ", ".join(f"{name} {ms:.0f} ms" for name, ms in outcome.phases_ms.items()))
        if self.usage is not None:
            usage = self.usage
            lines.append(
                f"llm: {usage.requests} request(s), {usage.refused} refused, "
                f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens"
            )
        lines += ["", "--- prompt ---", prompt]
        if self.exit is not None:
            lines += ["", "--- stdout ---", self.exit.stdout.text(), "", "--- stderr ---", self.exit.stderr.text()]
        return "\n".join(lines) + "\n"
