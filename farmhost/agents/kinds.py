"""Agent kinds: what a run starts in the sandbox — the built-in runner, OpenCode, or the operator's command.

Every kind runs in the same sandbox with the same limits and contract (AgentInput on stdin, AgentResult as the
last stdout line); a kind only changes the program and what it needs mounted. OpenCode is the binary of the
`opencode-ai` npm package at a pinned version, installed by `scripts/opencode-install` (or named by
FARMHOST_OPENCODE_BIN); it is mounted read-only and driven by `farmagent.opencode_run`.
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from farmhost.agents.backends.base import Mount, SandboxError
from farmhost.config import Settings
from farmhost.layout import REPO_ROOT

KindName = Literal["farmagent", "opencode", "command"]
OPENCODE_VERSION: Final = "1.18.33"  # scripts/opencode-install installs exactly this
# Where scripts/opencode-install puts it in a checkout; an installed farmhost has no such directory and finds
# OpenCode through FARMHOST_OPENCODE_BIN or PATH instead (opencode_binary).
OPENCODE_DIR: Final = REPO_ROOT / ".tools" / "opencode"
_NPM_ARCH: Final = {"x86_64": "x64", "aarch64": "arm64"}


@dataclass(frozen=True, kw_only=True)
class AgentKind:
    """How a run of one kind is started."""

    name: KindName
    argv: tuple[str, ...] | None = None  # kind `command`
    module: str = "farmagent.run"  # `python -m` entry point otherwise
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    needs_llm: bool = True
    address_limit: bool = True


def opencode_binary(settings: Settings) -> Path | None:
    """FARMHOST_OPENCODE_BIN, else the one scripts/opencode-install put under .tools/, else `opencode` on PATH."""
    if settings.opencode_bin is not None:
        return settings.opencode_bin
    arch = _NPM_ARCH.get(platform.machine())
    if arch is not None:
        installed = OPENCODE_DIR / "node_modules" / f"opencode-linux-{arch}" / "bin" / "opencode"
        if installed.is_file():
            return installed
    found = shutil.which("opencode")
    return Path(found).resolve() if found else None


def agent_kind(name: KindName, command: tuple[str, ...] | None, settings: Settings) -> AgentKind:
    """The AgentKind of a run.

    Raises:
        SandboxError: kind `opencode` without an OpenCode binary, or `command` without its argv.
    """
    if name == "command":
        if not command:
            raise SandboxError("agent kind command has no command (FARMHOST_AGENT_COMMAND or agentCommand)")
        return AgentKind(name=name, argv=command, needs_llm=False)
    if name == "opencode":
        binary = opencode_binary(settings)
        if binary is None or not binary.is_file():
            raise SandboxError(
                f"agent kind opencode: no OpenCode binary (run scripts/opencode-install for {OPENCODE_VERSION}, "
                "or set FARMHOST_OPENCODE_BIN)"
            )
        mount = Mount(source=binary.parent, target=str(binary.parent), read_only=True)
        # Bun's JavaScriptCore reserves tens of GB of address space it never touches: RLIMIT_AS would stop it at
        # start. Its memory is held by the run's cgroup.
        return AgentKind(name=name, module="farmagent.opencode_run", mounts=(mount,),
                         env={"FARMAGENT_OPENCODE": str(binary)}, address_limit=False)  # fmt: skip
    return AgentKind(name=name)
