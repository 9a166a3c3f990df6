"""Agent kinds: what a run starts in the sandbox — the built-in runner, OpenCode, or the operator's command.

Every kind runs in the same sandbox with the same limits and contract (AgentInput on stdin, AgentResult as the
last stdout line); a kind only changes the program and what it needs mounted. OpenCode is the binary of the
`opencode-ai` npm package at a pinned version, driven by `farmagent.opencode_run`: in the agent image (docker,
podman) the one `container/Dockerfile` installed at IMAGE_OPENCODE_BIN; on the host (bwrap, process) the one
`scripts/opencode-install` put in the checkout's `.tools/opencode` or `deploy/install.sh --with-opencode` in the
prefix's `opencode/` (or FARMHOST_OPENCODE_BIN), mounted read-only.
"""

from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.base import UNIX_AND_LOOPBACK_INET, UNIX_ONLY, Mount, SandboxError
from farmhost.config import KindName
from farmhost.layout import REPO_ROOT

# scripts/opencode-install installs exactly this; container/Dockerfile's OPENCODE_VERSION defaults to it.
OPENCODE_VERSION: Final = "1.18.33"
# Where scripts/opencode-install puts it in a checkout; an installed farmhost finds it next to its prefix
# (deploy/install.sh --with-opencode), through FARMHOST_OPENCODE_BIN or on PATH instead (opencode_binary).
OPENCODE_DIR: Final = REPO_ROOT / ".tools" / "opencode"
# deploy/install.sh --with-opencode: next to the virtualenv the daemon runs from (sys.prefix is the install prefix).
PREFIX_OPENCODE_DIR: Final = Path(sys.prefix) / "opencode"
# Where container/Dockerfile puts the binary in the agent image.
IMAGE_OPENCODE_BIN: Final = "/opt/opencode/bin/opencode"
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
    socket_families: tuple[int, ...] = UNIX_ONLY


def opencode_binary(configured: Path | None) -> Path | None:
    """The host's OpenCode (bwrap, process).

    `configured` (FARMHOST_OPENCODE_BIN), else the checkout's .tools/opencode, else the install prefix's opencode/
    (both installed by scripts/opencode-install), else `opencode` on PATH.
    """
    if configured is not None:
        return configured
    arch = _NPM_ARCH.get(platform.machine())
    if arch is not None:
        for directory in (OPENCODE_DIR, PREFIX_OPENCODE_DIR):
            installed = directory / "node_modules" / f"opencode-linux-{arch}" / "bin" / "opencode"
            if installed.is_file():
                return installed
    found = shutil.which("opencode")
    return Path(found).resolve() if found else None


def agent_kind(
    name: KindName, command: tuple[str, ...] | None, opencode_bin: Path | None, *, in_image: bool = False
) -> AgentKind:
    """The AgentKind of a run (`opencode_bin`: FARMHOST_OPENCODE_BIN).

    `in_image`: the run is a container of the agent image (docker, podman), which has its own OpenCode at
    IMAGE_OPENCODE_BIN, so the host's is neither needed nor mounted.

    Raises:
        SandboxError: kind `opencode` without an OpenCode binary, or `command` without its argv.
    """
    if name == "command":
        if not command:
            raise SandboxError("agent kind command has no command (FARMHOST_AGENT_COMMAND or agentCommand)")
        return AgentKind(name=name, argv=command, needs_llm=False)
    if name == "opencode" and in_image:
        return AgentKind(name=name, module="farmagent.opencode_run", env={"FARMAGENT_OPENCODE": IMAGE_OPENCODE_BIN},
                         address_limit=False, socket_families=UNIX_AND_LOOPBACK_INET)  # fmt: skip
    if name == "opencode":
        binary = opencode_binary(opencode_bin)
        if binary is None or not binary.is_file():
            raise SandboxError(
                f"agent kind opencode: no OpenCode binary (run scripts/opencode-install for {OPENCODE_VERSION}, "
                "or deploy/install.sh --with-opencode for an installed farmhost, or set FARMHOST_OPENCODE_BIN)"
            )
        mount = Mount(source=binary.parent, target=str(binary.parent), read_only=True)
        # Bun's JavaScriptCore reserves tens of GB of address space it never touches: RLIMIT_AS would stop it at
        # start. Its memory is held by the run's cgroup.
        return AgentKind(name=name, module="farmagent.opencode_run", mounts=(mount,),
                         env={"FARMAGENT_OPENCODE": str(binary)}, address_limit=False,
                         socket_families=UNIX_AND_LOOPBACK_INET)  # fmt: skip
    return AgentKind(name=name)
