"""The sandbox of a run (SPEC 2 and 8): which host directories it sees where, and its environment."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from farmhost.agents.kinds import AgentKind
from farmhost.agents.proxy.server import SOCKET_NAME
from farmhost.agents.sandbox.backends.base import Mount, RunLimits, SandboxError, SandboxSpec
from farmhost.agents.sandbox.identity import AgentIdentity, clear_setid_sync, hand_over_sync
from farmhost.layout import GLOBAL_MEMORY_FOLDER, DataLayout

logger = logging.getLogger(__name__)

GROUP_DIR: Final = "/workspace/group"
IPC_DIR: Final = "/workspace/ipc"
GLOBAL_DIR: Final = "/workspace/global"
FARM_STATE_DIR: Final = "/workspace/farm-state"
DASHBOARD_DIR: Final = "/workspace/dashboard"
RUN_DIR: Final = "/workspace/run"


def sandbox_mounts(layout: DataLayout, folder: str, *, is_main: bool) -> tuple[Mount, ...]:
    """The run's mounts: its workspace and IPC dir (rw), global memory, farm state and its run dir (ro), dashboards."""
    mounts = [
        Mount(source=layout.workspace(folder), target=GROUP_DIR, read_only=False),
        Mount(source=layout.group_ipc(folder), target=IPC_DIR, read_only=False),
        Mount(source=layout.workspace(GLOBAL_MEMORY_FOLDER), target=GLOBAL_DIR, read_only=True),
        Mount(source=layout.farm_state, target=FARM_STATE_DIR, read_only=True),
        # connect() to a Unix socket needs no write access to its directory
        Mount(source=layout.group_run(folder), target=RUN_DIR, read_only=True),
    ]
    if is_main:
        mounts.append(Mount(source=layout.dashboards, target=DASHBOARD_DIR, read_only=False))
    return tuple(mounts)


def sandbox_env(*, timezone: str, is_main: bool) -> dict[str, str]:
    """The agent's whole environment: where things are, the time zone; never a secret."""
    env = {
        "FARMAGENT_IPC_DIR": IPC_DIR,
        "FARMAGENT_GROUP_DIR": GROUP_DIR,
        "FARMAGENT_GLOBAL_DIR": GLOBAL_DIR,
        "FARMAGENT_FARM_STATE_DIR": FARM_STATE_DIR,
        "FARMAGENT_LLM_SOCKET": f"{RUN_DIR}/{SOCKET_NAME}",
        "TZ": timezone,
        "HOME": GROUP_DIR,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if is_main:
        env["FARMAGENT_DASHBOARD_DIR"] = DASHBOARD_DIR
    return env


def sandbox_spec(
    layout: DataLayout,
    *,
    folder: str,
    run_id: str,
    is_main: bool,
    limits: RunLimits,
    timezone: str,
    kind: AgentKind | None = None,
    argv: Sequence[str] | None = None,
    cgroup_memory: bool = False,
) -> SandboxSpec:
    """The SandboxSpec of one run of `kind` (the built-in runner by default; `argv` runs a command instead).

    `cgroup_memory`: the run's cgroup holds its memory limit, so no process gets RLIMIT_AS (base.rlimits_for).
    """
    if kind is None:
        kind = AgentKind(name="farmagent") if argv is None else AgentKind(name="command", argv=tuple(argv))
    return SandboxSpec(
        folder=folder,
        run_id=run_id,
        mounts=sandbox_mounts(layout, folder, is_main=is_main) + kind.mounts,
        env={**sandbox_env(timezone=timezone, is_main=is_main), **kind.env},
        argv=kind.argv,
        workdir=GROUP_DIR,
        limits=limits,
        module=kind.module,
        address_limit=kind.address_limit and not cgroup_memory,
        socket_families=kind.socket_families,
    )


def prepare_mounts_sync(spec: SandboxSpec, identity: AgentIdentity | None) -> None:
    """Create the host directories behind the mounts, give the writable ones to the agent's uid, check the quota.

    Blocking (it walks the workspace): call it in a thread, while no run of the group is active.

    Raises:
        SandboxError: the workspace is over its size limit.
    """
    for mount in spec.mounts:
        mount.source.mkdir(parents=True, exist_ok=True)
    trees = [m.source for m in spec.writable if m.target != IPC_DIR]  # the workspace first
    tops = [m.source for m in spec.writable if m.target == IPC_DIR]  # the host's own files in it stay the host's
    sizes = hand_over_sync(identity, trees, tops)
    used_mb, limit_mb = sizes[0] / 2**20, spec.limits.workspace_mb
    if used_mb > limit_mb:
        raise SandboxError(
            f"the group's workspace holds {used_mb:.0f} MiB, over its limit of {limit_mb} MiB "
            "(agent-limits.json workspaceMb); delete files from it before the next run"
        )


def after_run_sync(spec: SandboxSpec) -> int:
    """Clear setuid/setgid bits the run set in its writable directories; returns how many.

    Never raises: what it could not walk is logged, and the next run's set-up walks (and clears) it again.
    """
    try:
        return clear_setid_sync([m.source for m in spec.writable])
    except OSError as err:
        logger.error("run %s of %s: the clean-up after it could not walk its directories: %s", spec.run_id,
                     spec.folder, err)  # fmt: skip
        return 0
