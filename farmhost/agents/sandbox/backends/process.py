"""process: the agent as a plain child process on the host, no isolation at all (development only)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.base import LaunchPlan, SandboxError, SandboxSpec, module_argv, rlimits_for

# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH: Final = 107


@dataclass(frozen=True, kw_only=True)
class ProcessBackend:
    """Starts the agent directly; the FARMAGENT_* variables point at the host paths behind the mounts."""

    python: Path
    name: str = "process"
    isolated: bool = False

    def plan(self, spec: SandboxSpec) -> LaunchPlan:
        """The interpreter command line, its working directory and an environment rewritten to host paths."""
        workdir = spec.host_path(spec.workdir)
        if workdir is None:
            raise SandboxError(f"the working directory {spec.workdir} is not a mounted path")
        env = {key: self._host_value(spec, key, value, workdir) for key, value in spec.env.items()}
        env["PATH"] = os.defpath
        argv = spec.argv if spec.argv is not None else module_argv(str(self.python), spec.module)
        return LaunchPlan(argv=tuple(argv), env=env, cwd=Path(workdir), rlimits=rlimits_for(spec))

    @staticmethod
    def _host_value(spec: SandboxSpec, key: str, value: str, workdir: str) -> str:
        if not value.startswith("/"):
            return value
        host = spec.host_path(value)
        if host is None:
            return value
        if key.endswith("_SOCKET") and len(host.encode()) > MAX_SOCKET_PATH:
            # A long data dir (tests run in deep temporary paths) cannot be connected to by its absolute path;
            # the path relative to the working directory is short and reaches the same socket.
            return os.path.relpath(host, workdir)
        return host
