"""bubblewrap: new namespaces (no network), the run's mounts, the interpreter read-only, and nothing else."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.backends.base import FD_PLACEHOLDER, FdArg, LaunchPlan, SandboxSpec, rlimits_for
from farmhost.agents.backends.host import PythonInstall, SystemEntry

RUNNER: Final = ("-m", "farmagent.run")
HOSTNAME: Final = "farmagent"


@dataclass(frozen=True, kw_only=True)
class BwrapBackend:
    """Runs the agent under `bwrap` with the mounts of the spec; the host file system is otherwise absent."""

    bwrap: str
    python: PythonInstall
    system: tuple[SystemEntry, ...]
    seccomp: bytes | None  # the BPF program loaded before the agent starts (None: FARMHOST_SANDBOX_SECCOMP=off)
    name: str = "bwrap"
    isolated: bool = True

    def plan(self, spec: SandboxSpec) -> LaunchPlan:
        """The bwrap command line (the order matters: later mounts go on top of earlier ones)."""
        argv: list[str] = [
            self.bwrap,
            "--unshare-all",  # user, ipc, pid, net, uts, cgroup namespaces: no network at all
            "--unshare-user",  # even under root, so that the agent holds no capability on the host
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--hostname",
            HOSTNAME,
        ]
        fd_args: tuple[FdArg, ...] = ()
        if self.seccomp is not None:
            argv += ["--seccomp", FD_PLACEHOLDER]
            fd_args = (FdArg(index=len(argv) - 1, data=self.seccomp),)
        for key, value in sorted(spec.env.items()):
            argv += ["--setenv", key, value]
        for entry in self.system:
            argv += (
                ["--symlink", entry.link, entry.path]
                if entry.link is not None
                else ["--ro-bind", entry.path, entry.path]
            )
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in self.python.ro_paths:
            if not any(path == Path(e.path) or Path(e.path) in path.parents for e in self.system if e.link is None):
                argv += ["--ro-bind", str(path), str(path)]
        for mount in spec.mounts:
            argv += ["--ro-bind" if mount.read_only else "--bind", str(mount.source), mount.target]
        argv += ["--remount-ro", "/", "--chdir", spec.workdir, "--"]
        argv += spec.argv if spec.argv is not None else (str(self.python.executable), *RUNNER)
        return LaunchPlan(
            argv=tuple(argv),
            env={"PATH": os.defpath},  # bwrap's own environment: its pid-1 helper keeps it, readable in /proc/1
            rlimits=rlimits_for(spec.limits),
            signal_leader=False,
            fd_args=fd_args,
        )
