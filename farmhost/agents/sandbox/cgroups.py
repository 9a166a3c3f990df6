"""Run cgroups: memory summed over a run's processes (its tmpfs pages too), processes and CPU share, per run.

An rlimit binds one process; a run is many. Where the host lets the daemon create cgroups (root, or a systemd
unit with `Delegate=yes`), each bwrap run gets its own: cgroup v2 under the daemon's own cgroup (the daemon
moves itself into a `daemon` leaf first, as v2 requires), or v1's memory, pids and cpu hierarchies under the
daemon's place in each. The child joins it before it execs bwrap, so everything the run starts is counted.
`detect_sync` says whether this works here and, if not, why.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from farmhost.agents.sandbox.backends.base import RunLimits, SandboxError

logger = logging.getLogger(__name__)

ROOT: Final = Path("/sys/fs/cgroup")
V1_CONTROLLERS: Final = ("memory", "pids", "cpu")
_PERIOD_US: Final = 100_000


@dataclass(frozen=True, kw_only=True)
class CgroupSupport:
    """Where run cgroups go on this host, or why there are none."""

    version: Literal[1, 2] | None
    parents: dict[str, Path] = field(default_factory=dict)  # v1: controller -> parent; v2: {"unified": parent}
    reason: str = ""

    @property
    def available(self) -> bool:
        """Whether runs get a cgroup here."""
        return self.version is not None


def own_paths(text: str) -> dict[str, str]:
    """`/proc/self/cgroup` as {controller (or "" for v2): path}."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def detect_sync(root: Path = ROOT, *, enable: bool = True) -> CgroupSupport:
    """Find where this daemon may create run cgroups (v2 first); blocking, call it once at start in a thread.

    `enable=False` (the doctor) changes nothing: v2 controllers the process may enable are taken as available, and
    no process is moved into a `daemon` leaf.
    """
    mine = own_paths(Path("/proc/self/cgroup").read_text())
    if (root / "cgroup.controllers").exists():
        return _detect_v2(root / mine.get("", "/").lstrip("/"), enable=enable)
    parents: dict[str, Path] = {}
    for controller in V1_CONTROLLERS:
        mount = root / controller
        if not (mount / "cgroup.procs").exists() or controller not in mine:
            return CgroupSupport(version=None, reason=f"cgroup v1 has no {controller} hierarchy mounted")
        parent = mount / mine[controller].lstrip("/")
        if not os.access(parent, os.W_OK):
            return CgroupSupport(version=None, reason=f"{parent} is not writable by the daemon (run it as root)")
        parents[controller] = parent
    return CgroupSupport(version=1, parents=parents)


def _detect_v2(parent: Path, *, enable: bool) -> CgroupSupport:
    wanted = {"memory", "pids", "cpu"}
    available = set((parent / "cgroup.controllers").read_text().split())
    if not wanted <= available:
        missing = ", ".join(sorted(wanted - available))
        return CgroupSupport(version=None, reason=f"{parent} does not offer the {missing} controller(s)")
    if not os.access(parent / "cgroup.subtree_control", os.W_OK):
        reason = f"{parent} is not delegated to the daemon (systemd: Delegate=yes in its unit)"
        return CgroupSupport(version=None, reason=reason)
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    if not wanted <= enabled and enable:
        try:
            _enable(parent, wanted)
        except OSError as err:
            return CgroupSupport(version=None, reason=f"cannot enable controllers in {parent}: {err.strerror}")
    return CgroupSupport(version=2, parents={"unified": parent})


def _enable(parent: Path, controllers: set[str]) -> None:
    control = " ".join(f"+{name}" for name in sorted(controllers))
    try:
        (parent / "cgroup.subtree_control").write_text(control)
    except OSError as err:
        if err.errno != errno.EBUSY:
            raise
        # v2's rule: a cgroup with processes cannot hand controllers to children. Move the daemon into a leaf.
        leaf = parent / "daemon"
        leaf.mkdir(exist_ok=True)
        for pid in (parent / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # a process that just exited
                (leaf / "cgroup.procs").write_text(pid)
        (parent / "cgroup.subtree_control").write_text(control)


class RunCgroup:
    """The cgroup(s) of one run: created with its limits, joined by the launched child, removed afterwards."""

    def __init__(self, support: CgroupSupport, run_id: str, limits: RunLimits) -> None:
        self.dirs = [parent / f"farmhost-run-{run_id}" for parent in support.parents.values()]
        self._version = support.version
        for directory in self.dirs:
            directory.mkdir()
        memory, quota = limits.memory_mb * 1024 * 1024, limits.cpu_percent * _PERIOD_US // 100
        if self._version == 2:
            [directory] = self.dirs
            _write(directory / "memory.max", memory)
            _write(directory / "memory.swap.max", 0, optional=True)
            _write(directory / "pids.max", limits.pids)
            _write(directory / "cpu.max", f"{quota} {_PERIOD_US}")
        else:
            memory_dir, pids_dir, cpu_dir = self.dirs
            _write(memory_dir / "memory.limit_in_bytes", memory)
            _write(memory_dir / "memory.memsw.limit_in_bytes", memory, optional=True)
            _write(pids_dir / "pids.max", limits.pids)
            _write(cpu_dir / "cpu.cfs_period_us", _PERIOD_US)
            _write(cpu_dir / "cpu.cfs_quota_us", quota)

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The files the child writes its pid into to join (before exec)."""
        return tuple(str(directory / "cgroup.procs") for directory in self.dirs)

    def hit_memory_limit(self) -> bool:
        """Whether the kernel killed a process of the run for memory."""
        directory = self.dirs[0]
        try:
            if self._version == 2:
                events = dict(line.split() for line in (directory / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", "0")) > 0
            control = dict(line.split() for line in (directory / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", "0")) > 0
        except (OSError, ValueError):
            return False

    def close_sync(self) -> None:
        """Kill whatever of the run is left and remove its cgroup(s); blocking, call it in a thread."""
        for _ in range(50):
            pids = self._pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for directory in self.dirs:
            _remove(directory)

    def _pids(self) -> list[int]:
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(pid) for pid in (directory / "cgroup.procs").read_text().split())
        return sorted(found)


def joiner(procs_files: tuple[str, ...]) -> Callable[[], None]:
    """A preexec step: the child joins the run's cgroup(s), so that all it starts is counted there."""

    def join() -> None:
        pid = str(os.getpid()).encode()
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    return join


def _write(path: Path, value: object, *, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except FileNotFoundError:
        if not optional:
            raise


def _remove(directory: Path) -> None:
    for _ in range(50):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY:
                logger.warning("cannot remove the run cgroup %s: %s", directory, err)
                return
            time.sleep(0.02)  # its last processes are still being reaped
    logger.warning("the run cgroup %s is still busy; it is left behind", directory)


def open_run_cgroup_sync(support: CgroupSupport | None, run_id: str, limits: RunLimits, *, allow_without: bool,
                         ) -> RunCgroup | None:  # fmt: skip
    """The run's cgroup; None when the host has none and the operator allowed runs without (or no support asked).

    Raises:
        SandboxError: the host cannot hold the limits and FARMHOST_AGENT_UNENFORCED_LIMITS is not `allow`.
    """
    if support is None:
        return None  # a runtime that holds its limits itself (docker, podman) or none at all (process)
    if not support.available:
        if allow_without:
            return None
        raise SandboxError(
            f"this host cannot hold a run's memory, process and CPU limits ({support.reason}); delegate cgroups "
            "to farmhost (docs/agent-runtime.md#limits) or set FARMHOST_AGENT_UNENFORCED_LIMITS=allow"
        )
    try:
        return RunCgroup(support, run_id, limits)
    except OSError as err:
        raise SandboxError(f"cannot create the run's cgroup: {err}") from err
