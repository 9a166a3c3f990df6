"""The sandbox seam: what a run needs (SandboxSpec) and what a backend turns it into (LaunchPlan)."""

from __future__ import annotations

import resource
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from farmhost.errors import FarmhostError

# The socket families a run may create (socket(), socketpair()); the seccomp filter refuses every other one with
# EAFNOSUPPORT. Unix sockets reach the LLM proxy; nothing else is needed, and a family the network namespace does not
# cover (AF_VSOCK reaches the hypervisor) would be a way out.
UNIX_ONLY: Final[tuple[int, ...]] = (int(socket.AF_UNIX),)
# OpenCode reaches its model through an http:// URL: farmagent.opencode_run bridges 127.0.0.1 of the run's own
# network namespace (nothing but loopback) to the proxy's Unix socket.
UNIX_AND_LOOPBACK_INET: Final[tuple[int, ...]] = (int(socket.AF_UNIX), int(socket.AF_INET))
SOCKET_FAMILY_SETS: Final = (UNIX_ONLY, UNIX_AND_LOOPBACK_INET)


class SandboxError(FarmhostError):
    """A run cannot be launched safely (a secret would leak, a path cannot be mounted, ...)."""


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host path made visible inside the sandbox."""

    source: Path
    target: str
    read_only: bool


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    """What one run may use: wall time, memory, processes and LLM turns."""

    timeout_seconds: float
    memory_mb: int
    pids: int
    max_turns: int
    tmp_mb: int = 256  # each of the run's /tmp and /dev/shm
    workspace_mb: int = 1024  # the group's workspace, checked before each run
    cpu_percent: int = 100  # CPU time per wall time, 100 = one core (in the run's cgroup)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """Everything a backend needs to start one agent run; paths in `env`, `argv` and `workdir` are sandbox paths."""

    folder: str
    run_id: str
    mounts: tuple[Mount, ...]
    env: Mapping[str, str]
    argv: tuple[str, ...] | None  # None: the agent runner (`python -m farmagent.run`)
    workdir: str
    limits: RunLimits
    labels: Mapping[str, str] = field(default_factory=dict)
    module: str = "farmagent.run"  # what `python -m` runs when argv is None: the agent kind's entry point
    address_limit: bool = True  # RLIMIT_AS per process (off under a memory cgroup and for OpenCode: rlimits_for)
    socket_families: tuple[int, ...] = UNIX_ONLY  # one of SOCKET_FAMILY_SETS

    @property
    def writable(self) -> tuple[Mount, ...]:
        """The mounts the run can write into; what they hold is the group's on disk (sandbox/group_disk.py)."""
        return tuple(mount for mount in self.mounts if not mount.read_only)

    def host_path(self, sandbox_path: str) -> str | None:
        """The host path behind a sandbox path, through the most specific mount (None when unmounted)."""
        for mount in sorted(self.mounts, key=lambda m: len(m.target), reverse=True):
            if sandbox_path == mount.target or sandbox_path.startswith(mount.target + "/"):
                return str(mount.source) + sandbox_path[len(mount.target) :]
        return None


def module_argv(python: str, module: str) -> tuple[str, ...]:
    """The command line that runs `module` with `python`: `python -I -m <module>`.

    Isolated mode, because the run's working directory and HOME are the group's workspace, which the agent writes:
    without `-I` Python would import a package or module left there (or run a user site's `.pth`) before the host's
    runner, so an earlier run (of a kind that runs any code) could replace what every later run runs.
    """
    return (python, "-I", "-m", module)


# What an argument holds in a plan until launch.py puts the number of the descriptor there (see FdArg).
FD_PLACEHOLDER: Final = "<fd>"


@dataclass(frozen=True, kw_only=True)
class FdArg:
    """Bytes the launched process reads from an inherited descriptor; its number replaces `argv[index]`."""

    index: int
    data: bytes


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """The exact host process to start for a run, and how to stop it."""

    argv: tuple[str, ...]
    env: Mapping[str, str]  # the environment of the launched host process (never the daemon's own)
    cwd: Path | None = None
    # (resource, limit) pairs set in the child before exec; inherited by everything it starts.
    rlimits: tuple[tuple[int, int], ...] = ()
    # SIGTERM goes to every descendant of the launched process; also to its process group when this is set
    # (the process itself is the agent, or a CLI that forwards signals). bwrap dies on SIGTERM and would take
    # the agent down with SIGKILL (--die-with-parent) before it could clean up, so it is left out there.
    signal_leader: bool = True
    kill_argv: tuple[str, ...] | None = None  # run after SIGKILL when the sandbox lives outside the process tree
    # Container engines, after the process ended: a command printing `true` when the kernel killed a process of the
    # run for its memory limit (the container is kept until it has answered), and the one removing the container.
    oom_argv: tuple[str, ...] | None = None
    remove_argv: tuple[str, ...] | None = None
    fd_args: tuple[FdArg, ...] = ()  # e.g. bwrap's `--seccomp FD`


class SandboxBackend(Protocol):
    """Turns a SandboxSpec into a LaunchPlan; one implementation per runtime (docker, podman, bwrap, process)."""

    @property
    def name(self) -> str:
        """The runtime's name (`docker`, `podman`, `bwrap`, `process`)."""
        ...

    @property
    def isolated(self) -> bool:
        """Whether runs are sandboxed at all (`process` is not)."""
        ...

    def plan(self, spec: SandboxSpec) -> LaunchPlan:
        """The process to start for `spec` (pure: no I/O)."""
        ...


AGENT_NOFILE = 1024


def rlimits_for(spec: SandboxSpec) -> tuple[tuple[int, int], ...]:
    """The rlimits of a run started directly on the host (bwrap, process).

    The memory limit is the run's cgroup's (farmhost/agents/sandbox/cgroups.py; docker/podman: the engine's), which counts
    what the run's processes really use. RLIMIT_AS, which caps each process's address space, is only the fallback
    where no cgroup holds (FARMHOST_AGENT_UNENFORCED_LIMITS=allow, the `process` runtime): address space is not
    memory, and each thread reserves an 8 MiB stack and a 64 MiB malloc arena, so at 256 MB a Python agent starts
    about 6 threads under it (docs/security.md). A kind whose runtime reserves address space far beyond what it
    uses (OpenCode's JavaScriptCore) never gets it. RLIMIT_NPROC counts every process of the *real uid* (never
    uid 0: a root daemon's runs drop to an unprivileged one). RLIMIT_NOFILE goes back to the usual 1024: the
    daemon raised its own for the LLM proxy's connections.
    """
    limits = spec.limits
    address = ((resource.RLIMIT_AS, limits.memory_mb * 1024 * 1024),) if spec.address_limit else ()
    return (
        *address,
        (resource.RLIMIT_NPROC, limits.pids),
        (resource.RLIMIT_NOFILE, AGENT_NOFILE),
        (resource.RLIMIT_CORE, 0),  # no core files of an agent in its workspace
    )


def ensure_no_secrets(plan: LaunchPlan, secrets: Iterable[str | None]) -> None:
    """Refuse a plan whose arguments or environment contain a secret (defence in depth; the spec never has one).

    Raises:
        SandboxError: naming where the secret was found, never the secret.
    """
    for secret in secrets:
        if not secret or len(secret) < 4:
            continue
        for index, arg in enumerate(plan.argv):
            if secret in arg:
                raise SandboxError(f"refusing to start the agent: argument {index} holds a secret")
        for key, value in plan.env.items():
            if secret in value or secret in key:
                raise SandboxError(f"refusing to start the agent: environment variable {key} holds a secret")
