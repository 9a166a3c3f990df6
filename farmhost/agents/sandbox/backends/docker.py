"""docker: `docker run` of the agent image with the run's mounts, no network, a non-root uid and limits.

Not `--rm`: when the run has ended, the runtime asks the engine whether the kernel killed a process of the container
for its memory limit (`.State.OOMKilled`; the run's cgroup is the engine's, out of farmhost's sight), then removes
the container. A container left by a daemon that died in between is removed at the next start (orphan_commands).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from farmhost.agents.sandbox.backends.base import LaunchPlan, SandboxError, SandboxSpec, module_argv

RUN_LABEL: Final = "farmhost.run"
GROUP_LABEL: Final = "farmhost.group"
DATA_LABEL: Final = "farmhost.data"
# What the engine's CLI needs from the daemon's environment to find the engine; nothing else reaches it.
CLI_ENV: Final = ("PATH", "HOME", "XDG_RUNTIME_DIR", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT",
                  "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "CONTAINER_HOST", "CONTAINERS_CONF")  # fmt: skip


def cli_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The engine CLI's environment: only the variables that locate the engine."""
    env = {key: environ[key] for key in CLI_ENV if key in environ}
    env.setdefault("PATH", os.defpath)
    return env


@dataclass(frozen=True, kw_only=True)
class DockerBackend:
    """Runs the agent in a fresh container of `image`; the container is removed when the run ends."""

    image: str
    # uid, gid inside the container: the group's own under a root daemon (given per run), else the data dir's owner
    user: tuple[int, int] | None
    data_root: str  # labels the containers of this data directory, so clean-up never touches another's
    environ: Mapping[str, str] = field(default_factory=dict)  # the daemon's environment, filtered by cli_env
    # farmhost's seccomp profile files by the socket families they allow (the spec's picks one); None: the
    # engine's default profile (FARMHOST_SANDBOX_SECCOMP=off).
    seccomp_profiles: Mapping[tuple[int, ...], str] | None = None
    engine: str = "docker"
    name: str = "docker"
    isolated: bool = True

    def plan(self, spec: SandboxSpec) -> LaunchPlan:
        """The `docker run` command line."""
        command = spec.argv if spec.argv is not None else module_argv("python", spec.module)
        # The command replaces the image's ENTRYPOINT, not its arguments: otherwise `python -m farmagent.run`
        # (the entrypoint) would get the command as arguments and every kind would start the built-in runner.
        argv = [self.engine, *self._run_args(spec), "--entrypoint", command[0], self.image, *command[1:]]
        container = self.container_name(spec)
        return LaunchPlan(
            argv=tuple(argv),
            env=cli_env(self.environ),
            kill_argv=(self.engine, "rm", "-f", container),
            oom_argv=(self.engine, "inspect", "--format", "{{.State.OOMKilled}}", container),
            remove_argv=(self.engine, "rm", "-f", container),
        )

    def container_name(self, spec: SandboxSpec) -> str:
        """A name per run, so that a run can be removed even when its CLI process is gone."""
        return f"farmhost-{spec.folder}-{spec.run_id}"

    def _run_args(self, spec: SandboxSpec) -> list[str]:
        if self.user is None:
            raise SandboxError(f"run {spec.run_id} of {spec.folder} has no uid of its group's: refusing to start it")
        uid, gid = self.user
        limits = spec.limits
        args = [
            "run", "-i", "--init",
            "--name", self.container_name(spec),
            "--network", "none",
            "--user", f"{uid}:{gid}",
            "--memory", f"{limits.memory_mb}m",
            "--memory-swap", f"{limits.memory_mb}m",  # the same value: no swap on top of the memory limit
            "--pids-limit", str(limits.pids),
            "--cpus", f"{limits.cpu_percent / 100:g}",
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--read-only",
            "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_mb}m,mode=1777",
            "--shm-size", f"{limits.tmp_mb}m",
            "--workdir", spec.workdir,
            "--label", f"{GROUP_LABEL}={spec.folder}",
            "--label", f"{RUN_LABEL}={spec.run_id}",
            "--label", f"{DATA_LABEL}={self.data_root}",
        ]  # fmt: skip
        if self.seccomp_profiles is not None:
            profile = self.seccomp_profiles.get(spec.socket_families)
            if profile is None:
                families = ", ".join(socket.AddressFamily(family).name for family in spec.socket_families)
                raise SandboxError(f"no seccomp profile was written for runs with the socket families {families}")
            args += ["--security-opt", f"seccomp={profile}"]
        args += self._engine_args()
        for key, value in sorted(spec.labels.items()):
            args += ["--label", f"{key}={value}"]
        for mount in spec.mounts:
            source = str(mount.source)
            if ":" in source or "," in source:
                raise SandboxError(f"{source} cannot be mounted by {self.engine}: its path contains ':' or ','")
            options = ["ro"] if mount.read_only else []
            options += self._mount_options()
            args += ["-v", f"{source}:{mount.target}" + (f":{','.join(options)}" if options else "")]
        for key, value in sorted(spec.env.items()):
            args += ["-e", f"{key}={value}"]
        return args

    def _engine_args(self) -> list[str]:
        return []

    def _mount_options(self) -> list[str]:
        # docker's -v and --mount take no nosuid: a setuid file in a workspace gains nothing in the container
        # through --security-opt no-new-privileges, and the data dir keeps it from other local users (layout.py).
        return []

    def orphan_commands(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The command listing this data dir's leftover agent containers, and the prefix that removes them."""
        listing = (
            self.engine, "ps", "-aq",
            "--filter", f"label={RUN_LABEL}",
            "--filter", f"label={DATA_LABEL}={self.data_root}",
        )  # fmt: skip
        return listing, (self.engine, "rm", "-f")
