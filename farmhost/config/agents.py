"""The agent runs' sections: the LLM endpoints in order, the default run limits, the sandbox, the runtime's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

RuntimeName = Literal["docker", "podman", "bwrap", "process"]
KindName = Literal["farmagent", "opencode", "command"]


@dataclass(frozen=True)
class LlmEndpoint:
    """One OpenAI-compatible endpoint of the chain: its place (1 is FARMHOST_LLM_*), URL, model, key, and vision."""

    number: int
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    vision: bool = False  # the model accepts image parts (FARMHOST_LLM[_n]_VISION); the proxy strips them if not

    @property
    def env_prefix(self) -> str:
        """The settings' prefix: FARMHOST_LLM for the first, FARMHOST_LLM_<n> for the fallbacks."""
        return "FARMHOST_LLM" if self.number == 1 else f"FARMHOST_LLM_{self.number}"

    @property
    def label(self) -> str:
        """How logs, replies and the doctor name it: the model and the host, never the path or credentials."""
        host = urlsplit(self.base_url).hostname or "?"
        port = urlsplit(self.base_url).port
        return f"{self.model} at {host}{f':{port}' if port else ''}"


@dataclass(frozen=True, kw_only=True)
class LlmSettings:
    """The LLM proxy's: the endpoints in the order they are tried (empty: no LLM), caps, budgets, the zone."""

    endpoints: tuple[LlmEndpoint, ...]
    cooldown_seconds: float
    run_connections: int
    max_connections: int
    max_tokens: int
    stream_idle_timeout: float
    requests_per_day: int  # each group's default daily budgets (agent-limits.json may override them)
    tokens_per_day: int
    zone: ZoneInfo  # the budgets' days are the farm's
    # The endpoints' (smallest) context in tokens, given to the built-in runner, which trims its prompt to it.
    context_tokens: int | None = None

    @property
    def enabled(self) -> bool:
        """An LLM endpoint is configured."""
        return bool(self.endpoints)

    @property
    def model(self) -> str:
        """The model agents are given: the first endpoint's ("" without an LLM)."""
        return self.endpoints[0].model if self.endpoints else ""

    @property
    def vision(self) -> bool:
        """Some endpoint of the chain accepts images (photos are attached to runs; the proxy strips them for others)."""
        return any(endpoint.vision for endpoint in self.endpoints)


@dataclass(frozen=True, kw_only=True)
class LimitSettings:
    """Every run's limits when agent-limits.json does not override them (FARMHOST_AGENT_*)."""

    timeout_seconds: float
    memory_mb: int
    pids: int
    max_turns: int
    tmp_mb: int
    workspace_mb: int
    cpu_percent: int


@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    """The sandbox backend's: the runtime (resolved once at load), image, interpreter, seccomp and agent ids."""

    runtime: RuntimeName
    data_dir: Path
    image: str
    python: Path | None  # the agents' interpreter (FARMHOST_AGENT_PYTHON), None: the daemon's own
    seccomp: Literal["required", "off"]
    proc: Literal["new", "container"] = "new"  # FARMHOST_SANDBOX_PROC: bwrap's /proc (docs/deployment.md, add-on)
    uid_base: int
    uid_count: int
    max_agents: int


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """The agent runtime's: what a run starts, its output and memory budgets, and the sections of its parts."""

    kind: KindName
    command: tuple[str, ...] | None  # FARMHOST_AGENT_COMMAND as argv
    opencode_bin: Path | None
    max_agents: int
    output_bytes: int
    memory_prompt_chars: int
    unenforced_limits: Literal["refuse", "allow"]
    zone: ZoneInfo
    disk_reserve_mb: int  # a run is ended when a filesystem it writes to has less free (0: never)
    secrets: tuple[str, ...] = field(repr=False)  # the host's tokens and keys: never in a sandbox's command or env
    limits: LimitSettings
    llm: LlmSettings
    sandbox: SandboxSettings
