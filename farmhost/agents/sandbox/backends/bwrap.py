"""bubblewrap: new namespaces (no network), the run's mounts, the interpreter read-only, and nothing else."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final, Literal

from farmhost.agents.sandbox.backends.base import (
    FD_PLACEHOLDER,
    FdArg,
    LaunchPlan,
    SandboxError,
    SandboxSpec,
    module_argv,
    rlimits_for,
)
from farmhost.agents.sandbox.backends.host_paths import PythonInstall, SystemEntry
from farmhost.agents.sandbox.backends.share import LAUNCHER
from farmhost.agents.sandbox.identity import AgentIdentity

HOSTNAME: Final = "farmagent"


@dataclass(frozen=True, kw_only=True)
class BwrapBackend:
    """Runs the agent under `bwrap` with the mounts of the spec; the host file system is otherwise absent."""

    bwrap: str
    python: PythonInstall
    system: tuple[SystemEntry, ...]
    identity: AgentIdentity | None  # who the agent is; None under a root daemon until its group's is given
    setpriv: str | None  # util-linux's setpriv, inside the sandbox at the same path (under /usr)
    # The BPF programs loaded before the agent starts, by the socket families they allow (the spec's picks one);
    # None: FARMHOST_SANDBOX_SECCOMP=off.
    seccomp: Mapping[tuple[int, ...], bytes] | None
    inotify_share: int = 0  # a daemon that is not root: the inotify instances each run may hold (share.py)
    # `new`: a /proc of the run's own pid namespace. `container`: the /proc farmhost sees, bound read-only, where the
    # kernel refuses a new one (a container's masked /proc paths, as in a Home Assistant add-on): the run then sees
    # the container's process list, not the host's; other uids' environments and memory stay closed to it.
    proc: Literal["new", "container"] = "new"
    name: str = "bwrap"
    isolated: bool = True

    def plan(self, spec: SandboxSpec) -> LaunchPlan:
        """The bwrap command line (the order matters: later mounts go on top of earlier ones).

        Raises:
            SandboxError: no identity was given for the run (a root daemon's runs are their group's), or setpriv
                is missing.
        """
        if self.identity is None:
            raise SandboxError(f"run {spec.run_id} of {spec.folder} has no uid of its group's: refusing to start it")
        identity = self.identity
        argv: list[str] = [self.bwrap, *self._namespaces(identity), "--die-with-parent", "--new-session", "--clearenv"]
        argv += ["--hostname", HOSTNAME]
        fd_args: tuple[FdArg, ...] = ()
        if self.seccomp is not None:
            bpf = self.seccomp.get(spec.socket_families)
            if bpf is None:
                families = ", ".join(socket.AddressFamily(family).name for family in spec.socket_families)
                raise SandboxError(f"no seccomp filter was built for runs with the socket families {families}")
            argv += ["--seccomp", FD_PLACEHOLDER]
            fd_args = (FdArg(index=len(argv) - 1, data=bpf),)
        for key, value in sorted(spec.env.items()):
            argv += ["--setenv", key, value]
        for entry in self.system:
            argv += (
                ["--symlink", entry.link, entry.path]
                if entry.link is not None
                else ["--ro-bind", entry.path, entry.path]
            )
        tmp_bytes = str(spec.limits.tmp_mb * 1024 * 1024)
        argv += ["--proc", "/proc"] if self.proc == "new" else ["--ro-bind", "/proc", "/proc"]
        argv += ["--dev", "/dev", "--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp"]
        argv += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]  # else part of /dev, uncapped
        binds = [
            path
            for path in self.python.ro_paths
            if not any(path == Path(e.path) or Path(e.path) in path.parents for e in self.system if e.link is None)
        ]
        # Directories bwrap creates on the way to a mount copy the host's modes (/root is 0700): traversable here.
        made: set[str] = set()
        for target in [*(str(path) for path in binds), *(mount.target for mount in spec.mounts)]:
            for parent in reversed(PurePosixPath(target).parents[:-1]):
                if str(parent) not in made:
                    made.add(str(parent))
                    argv += ["--perms", "0755", "--dir", str(parent)]
        for path in binds:
            argv += ["--ro-bind", str(path), str(path)]
        for mount in spec.mounts:
            argv += ["--ro-bind" if mount.read_only else "--bind", str(mount.source), mount.target]
        argv += ["--remount-ro", "/", "--chdir", spec.workdir, "--"]
        argv += self._drop(identity, spec)
        argv += spec.argv if spec.argv is not None else module_argv(str(self.python.executable), spec.module)
        rlimits = rlimits_for(spec)
        if not identity.switch:  # set inside the run's user namespace (share.py), not as the daemon uid's ceiling
            rlimits = tuple(pair for pair in rlimits if pair[0] != resource.RLIMIT_NPROC)
        return LaunchPlan(
            argv=tuple(argv),
            env={"PATH": os.defpath},  # bwrap's own environment: its pid-1 helper keeps it, readable in /proc/1
            rlimits=rlimits,
            signal_leader=False,
            fd_args=fd_args,
        )

    def _namespaces(self, identity: AgentIdentity) -> list[str]:
        # ipc, pid, net, uts and cgroup namespaces always: no network at all.
        unshare = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if not identity.switch:
            # Not root: a user namespace in which the agent holds no capability on the host. CAP_SYS_RESOURCE in
            # that namespace is the launcher's, to cap the namespace's inotify instances; the agent gets none.
            return [*unshare, "--unshare-user", "--cap-drop", "ALL", "--cap-add", "CAP_SYS_RESOURCE"]
        # Root: uid 0 in a user namespace root made is host root for files. bwrap sets the sandbox up as root
        # without one, keeping only what setpriv needs to become the agent's uid, which then has nothing.
        keep = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        return [*unshare, "--cap-drop", "ALL", *keep]

    def _drop(self, identity: AgentIdentity, spec: SandboxSpec) -> list[str]:
        if not identity.switch:
            # The container's /proc/sys is read-only: the run's inotify share cannot be set there (docs/security.md).
            share = "0" if self.proc == "container" else str(max(self.inotify_share, 1))
            return [str(self.python.executable), "-I", "-c", LAUNCHER, share, str(spec.limits.pids)]
        if self.setpriv is None:
            raise SandboxError("setpriv (util-linux) is needed to run agents as an unprivileged user under root")
        ids = [f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups"]
        return [self.setpriv, *ids, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
