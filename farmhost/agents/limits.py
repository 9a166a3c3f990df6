"""Run limits per group: the settings' defaults, overridden by `<data>/agent-limits.json` when it is valid."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from farmhost.agents.sandbox.backends.base import RunLimits
from farmhost.config import AgentSettings, KindName, LimitSettings, LlmSettings

logger = logging.getLogger(__name__)


class LimitsOverride(BaseModel):
    """Some of a run's limits; the ones left out keep the value from the level below."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeoutSeconds: float | None = Field(default=None, gt=0, le=86400)  # the file's camelCase keys
    memoryMb: int | None = Field(default=None, ge=64, le=65536)
    pids: int | None = Field(default=None, ge=8, le=65536)
    maxTurns: int | None = Field(default=None, ge=1, le=100)
    tmpMb: int | None = Field(default=None, ge=1, le=65536)
    workspaceMb: int | None = Field(default=None, ge=1, le=1048576)
    cpuPercent: int | None = Field(default=None, ge=1, le=6400)
    llmRequestsPerDay: int | None = Field(default=None, ge=1, le=1_000_000)
    llmTokensPerDay: int | None = Field(default=None, ge=1, le=10_000_000_000)
    # What the group's runs start (docs/agent-runtime.md#agent-kinds); agentCommand is the argv of kind `command`.
    agentKind: Literal["farmagent", "opencode", "command"] | None = None
    agentCommand: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _command_for_its_kind(self) -> LimitsOverride:
        if self.agentKind == "command" and self.agentCommand is None:
            raise ValueError("agentKind command needs agentCommand (the agent's argv, a list of strings)")
        return self

    def apply(self, limits: RunLimits) -> RunLimits:
        """`limits` with the values this override sets."""
        return RunLimits(
            timeout_seconds=self.timeoutSeconds if self.timeoutSeconds is not None else limits.timeout_seconds,
            memory_mb=self.memoryMb if self.memoryMb is not None else limits.memory_mb,
            pids=self.pids if self.pids is not None else limits.pids,
            max_turns=self.maxTurns if self.maxTurns is not None else limits.max_turns,
            tmp_mb=self.tmpMb if self.tmpMb is not None else limits.tmp_mb,
            workspace_mb=self.workspaceMb if self.workspaceMb is not None else limits.workspace_mb,
            cpu_percent=self.cpuPercent if self.cpuPercent is not None else limits.cpu_percent,
        )

    def apply_llm(self, budget: LlmBudget) -> LlmBudget:
        """`budget` with the daily LLM budgets this override sets."""
        return LlmBudget(
            requests_per_day=self.llmRequestsPerDay if self.llmRequestsPerDay is not None else budget.requests_per_day,
            tokens_per_day=self.llmTokensPerDay if self.llmTokensPerDay is not None else budget.tokens_per_day,
        )


@dataclass(frozen=True)
class LlmBudget:
    """A group's daily LLM budgets: requests and tokens (prompt + completion) per day of the farm's calendar."""

    requests_per_day: int
    tokens_per_day: int


class LimitsFile(BaseModel):
    """`agent-limits.json`: `{"default": {...}, "groups": {"<folder>": {...}}}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: LimitsOverride = LimitsOverride()
    groups: dict[str, LimitsOverride] = {}


def default_limits(settings: LimitSettings) -> RunLimits:
    """The limits of every run when no file overrides them (FARMHOST_AGENT_* settings)."""
    return RunLimits(
        timeout_seconds=settings.timeout_seconds,
        memory_mb=settings.memory_mb,
        pids=settings.pids,
        max_turns=settings.max_turns,
        tmp_mb=settings.tmp_mb,
        workspace_mb=settings.workspace_mb,
        cpu_percent=settings.cpu_percent,
    )


def default_llm_budget(settings: LlmSettings) -> LlmBudget:
    """The daily LLM budgets of every group when no file overrides them (FARMHOST_LLM_*_PER_DAY settings)."""
    return LlmBudget(requests_per_day=settings.requests_per_day, tokens_per_day=settings.tokens_per_day)


class LimitsReader:
    """Reads the limits file when it changes; a broken file is reported once and the defaults apply."""

    def __init__(self, path: Path, defaults: RunLimits, llm: LlmBudget) -> None:
        self._path = path
        self._defaults = defaults
        self._llm = llm
        self._seen: tuple[int, int] | None = None
        self._file = LimitsFile()

    @classmethod
    def of(cls, path: Path, settings: AgentSettings) -> LimitsReader:
        """A reader of `path` over the defaults of the agent runtime's section (its limits and its LLM budgets)."""
        return cls(path, default_limits(settings.limits), default_llm_budget(settings.llm))

    def limits(self, folder: str) -> RunLimits:
        """The limits of `folder`'s next run."""
        parsed = self._load()
        limits = parsed.default.apply(self._defaults)
        override = parsed.groups.get(folder)
        return override.apply(limits) if override is not None else limits

    def agent_choice(
        self, folder: str, kind: KindName, command: tuple[str, ...] | None
    ) -> tuple[KindName, tuple[str, ...] | None]:
        """The kind and command of `folder`'s next run: its entry, else the file's default, else the settings'."""
        parsed = self._load()
        for level in (parsed.default, parsed.groups.get(folder)):
            if level is not None and level.agentKind is not None:
                kind = level.agentKind
                command = tuple(level.agentCommand) if level.agentCommand else None
        return kind, command

    def llm_budget(self, folder: str) -> LlmBudget:
        """The daily LLM budgets of `folder` (read at every request: a change applies at once)."""
        parsed = self._load()
        budget = parsed.default.apply_llm(self._llm)
        override = parsed.groups.get(folder)
        return override.apply_llm(budget) if override is not None else budget

    def _load(self) -> LimitsFile:
        try:
            info = self._path.stat()
        except FileNotFoundError:
            self._seen, self._file = None, LimitsFile()
            return self._file
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._seen:
            self._seen = stamp
            self._file = self._parse()
        return self._file

    def _parse(self) -> LimitsFile:
        try:
            return LimitsFile.model_validate(json.loads(self._path.read_bytes()))
        except (OSError, ValueError) as err:
            logger.error("%s: %s; every group runs with the default limits until it is fixed", self._path, explain(err))
            return LimitsFile()


def explain(err: Exception) -> str:
    """One line saying what is wrong with the limits file, naming the field."""
    if isinstance(err, ValidationError):
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        return f"{where}: {first['msg']}" + (f" (got {first['input']!r})" if first["type"] != "missing" else "")
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON: {err.msg} at line {err.lineno} column {err.colno}"
    return str(err)
