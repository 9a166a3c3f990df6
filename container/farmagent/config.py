"""AgentSettings: every FARMAGENT_* environment variable, read and checked in this one place.

Precedence: an explicit argument (constructor field) wins over the environment, which wins over the
sandbox defaults below (the mount points of SPEC section 2). For the LLM, `FARMAGENT_LLM_BASE_URL` (a plain
http(s) URL, for development) wins over `FARMAGENT_LLM_SOCKET` (the host's proxy socket).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from farmagent.errors import ConfigError

WaitMode = Literal["inotify", "poll"]
WAIT_MODES: Final = ("inotify", "poll")

IPC_DIR: Final = Path("/workspace/ipc")
GROUP_DIR: Final = Path("/workspace/group")
GLOBAL_DIR: Final = Path("/workspace/global")
FARM_STATE_DIR: Final = Path("/workspace/farm-state")
LLM_SOCKET: Final = Path("/workspace/run/llm.sock")
# One chat completion of a small model on a busy host can take a minute; the run's own wall-time limit
# (host side, default 600 s) bounds the whole loop.
LLM_TIMEOUT: Final = 120.0
LLM_MAX_RETRIES: Final = 2
MAX_SOURCE_CHARS: Final = 200


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """Where the agent's mounts are and how it reaches the host and the LLM."""

    ipc_dir: Path = IPC_DIR
    group_dir: Path = GROUP_DIR
    global_dir: Path = GLOBAL_DIR
    farm_state_dir: Path = FARM_STATE_DIR
    # The host mounts the dashboards, and sets FARMAGENT_DASHBOARD_DIR, for the main group only: the one sign
    # inside the sandbox that this is main (the host still decides every request).
    dashboard_dir: Path | None = None
    llm_socket: Path = LLM_SOCKET
    llm_base_url: str | None = None
    ipc_mode: WaitMode = "inotify"
    llm_timeout: float = LLM_TIMEOUT
    llm_max_retries: int = LLM_MAX_RETRIES
    llm_context_tokens: int | None = None  # the endpoint's context size, when the host knows it (budget.py)
    llm_context_source: str | None = None  # where the host has that figure from, for the run log

    @property
    def is_main(self) -> bool:
        """Whether the host started this sandbox for the main group (it gave it the dashboards)."""
        return self.dashboard_dir is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentSettings:
        """Read the settings from `environ` (default `os.environ`).

        Variables: FARMAGENT_IPC_DIR, FARMAGENT_GROUP_DIR, FARMAGENT_GLOBAL_DIR, FARMAGENT_FARM_STATE_DIR,
        FARMAGENT_DASHBOARD_DIR (main only), FARMAGENT_LLM_SOCKET, FARMAGENT_LLM_BASE_URL, FARMAGENT_IPC_MODE (inotify|poll), FARMAGENT_LLM_TIMEOUT
        (seconds), FARMAGENT_LLM_MAX_RETRIES (retries of 408/409/429/5xx and connection errors; farmagent.llm),
        FARMAGENT_LLM_CONTEXT_TOKENS (the endpoint's context size; farmagent.budget), FARMAGENT_LLM_CONTEXT_SOURCE
        (where the host has it from: the setting, llama.cpp's /props or Ollama's /api/show; said in the run log).

        Raises:
            ConfigError: a value cannot be used (names the variable).
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        base_url = get("FARMAGENT_LLM_BASE_URL")
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"FARMAGENT_LLM_BASE_URL must be an http:// or https:// URL, not {base_url!r}")
        mode = (get("FARMAGENT_IPC_MODE") or "inotify").lower()
        if mode not in ("inotify", "poll"):
            raise ConfigError(f"FARMAGENT_IPC_MODE must be inotify or poll, not {mode!r}")
        context = get("FARMAGENT_LLM_CONTEXT_TOKENS")
        return cls(
            ipc_dir=Path(get("FARMAGENT_IPC_DIR") or IPC_DIR),
            group_dir=Path(get("FARMAGENT_GROUP_DIR") or GROUP_DIR),
            global_dir=Path(get("FARMAGENT_GLOBAL_DIR") or GLOBAL_DIR),
            farm_state_dir=Path(get("FARMAGENT_FARM_STATE_DIR") or FARM_STATE_DIR),
            dashboard_dir=Path(dashboards) if (dashboards := get("FARMAGENT_DASHBOARD_DIR")) else None,
            llm_socket=Path(get("FARMAGENT_LLM_SOCKET") or LLM_SOCKET),
            llm_base_url=base_url,
            ipc_mode="poll" if mode == "poll" else "inotify",
            llm_timeout=_number(get("FARMAGENT_LLM_TIMEOUT"), "FARMAGENT_LLM_TIMEOUT", LLM_TIMEOUT, 1, 3600),
            llm_max_retries=int(
                _number(get("FARMAGENT_LLM_MAX_RETRIES"), "FARMAGENT_LLM_MAX_RETRIES", LLM_MAX_RETRIES, 0, 10)
            ),
            llm_context_tokens=None
            if context is None
            else int(_number(context, "FARMAGENT_LLM_CONTEXT_TOKENS", 0, 512, 10_000_000)),
            llm_context_source=_text(get("FARMAGENT_LLM_CONTEXT_SOURCE"), MAX_SOURCE_CHARS),
        )


def _text(value: str | None, limit: int) -> str | None:
    """A one-line note for the log: printable characters only, at most `limit`."""
    if value is None:
        return None
    return "".join(c if c.isprintable() else "?" for c in value[:limit])


def _number(value: str | None, name: str, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {value!r}") from None
    if not low <= number <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, not {value}")
    return number
