"""Sandbox backends, one module each, and the factory that picks one from the settings."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from farmhost.agents.sandbox.backends.base import (
    SOCKET_FAMILY_SETS,
    UNIX_ONLY,
    LaunchPlan,
    Mount,
    RunLimits,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    ensure_no_secrets,
)
from farmhost.agents.sandbox.backends.bwrap import BwrapBackend
from farmhost.agents.sandbox.backends.docker import DockerBackend, cli_env
from farmhost.agents.sandbox.backends.engine_cli import engine_command
from farmhost.agents.sandbox.backends.host_paths import find_python_install_sync, system_entries
from farmhost.agents.sandbox.backends.podman import PodmanBackend
from farmhost.agents.sandbox.backends.process import ProcessBackend
from farmhost.agents.sandbox.backends.share import inotify_share
from farmhost.agents.sandbox.identity import AgentIdentity, GroupIds, IdRange, daemon_identity
from farmhost.agents.sandbox.seccomp import SeccompUnavailable, engine_profile, filter_for
from farmhost.config import SandboxSettings
from farmhost.layout import DataLayout

__all__ = [
    "BwrapBackend",
    "DockerBackend",
    "LaunchPlan",
    "Mount",
    "PodmanBackend",
    "ProcessBackend",
    "RunLimits",
    "SandboxBackend",
    "SandboxError",
    "SandboxSpec",
    "cleanup_orphans",
    "create_backend",
    "ensure_no_secrets",
    "for_identity",
    "group_ids",
]

logger = logging.getLogger(__name__)


def container_user(data_dir: Path) -> tuple[int, int]:
    """The uid:gid of docker/podman runs of a daemon that is not root: the data directory's owner."""
    info = os.stat(data_dir)
    return info.st_uid, info.st_gid


def group_ids(settings: SandboxSettings, backend: SandboxBackend) -> GroupIds:
    """Who each group's runs are under `backend`: a uid per group when the daemon is root, else one shared."""
    per_group = IdRange.of(settings) if os.geteuid() == 0 else None
    shared: AgentIdentity | None = None
    if isinstance(backend, BwrapBackend):
        shared = daemon_identity()
    elif isinstance(backend, DockerBackend):  # podman too
        uid, gid = backend.user or container_user(settings.data_dir)
        shared = AgentIdentity(uid=uid, gid=gid, switch=False)
    else:
        per_group = None  # the `process` runtime: the daemon itself
    return GroupIds(data_dir=settings.data_dir, per_group=per_group, shared=shared)


def for_identity(backend: SandboxBackend, identity: AgentIdentity | None) -> SandboxBackend:
    """`backend` whose runs are `identity` (bwrap: the uid setpriv drops to; docker/podman: `--user`)."""
    if identity is None:
        return backend
    if isinstance(backend, BwrapBackend):
        return replace(backend, identity=identity)
    if isinstance(backend, DockerBackend):  # podman too
        return replace(backend, user=(identity.uid, identity.gid))
    return backend


async def create_backend(settings: SandboxSettings) -> SandboxBackend:
    """The backend of `settings.runtime`, with what it needs of the host looked up once.

    Raises:
        SandboxError: the runtime's program is missing, the agent interpreter cannot be inspected, or bwrap's
            seccomp filter cannot be built while FARMHOST_SANDBOX_SECCOMP is `required`.
    """
    runtime = settings.runtime
    if runtime == "process":
        logger.warning("agent runtime 'process': agents run WITHOUT isolation (development only)")
        return ProcessBackend(python=settings.python or Path(sys.executable))
    binary = shutil.which(runtime)
    if binary is None:
        raise SandboxError(f"agent runtime {runtime!r}: {runtime} is not installed (or set FARMHOST_AGENT_RUNTIME)")
    if runtime == "bwrap":
        python = await asyncio.to_thread(find_python_install_sync, settings.python)
        if python.farmagent is None:
            logger.error("the agent interpreter %s cannot import farmagent; agent runs will fail", python.executable)
        as_root = os.geteuid() == 0
        identity = None if as_root else daemon_identity()  # root: each group's own, given per run (for_identity)
        setpriv = shutil.which("setpriv")
        if as_root and setpriv is None:
            raise SandboxError("setpriv (util-linux) is needed to run agents as their group's uid under root")
        if as_root:
            ids = IdRange.of(settings)
            logger.info(
                "agent runs drop to their group's own uid, from %d..%d (the daemon is root)", ids.base, ids.last
            )
        try:
            filters = await asyncio.to_thread(filter_for, settings.seccomp)
        except SeccompUnavailable as err:
            raise SandboxError(err.message) from err
        if filters is not None:
            logger.info("bwrap runs get a seccomp filter: %s", filters[UNIX_ONLY].describe())
        bpf = {families: built.bpf for families, built in filters.items()} if filters is not None else None
        return BwrapBackend(
            bwrap=binary,
            python=python,
            system=system_entries(),
            identity=identity,
            setpriv=setpriv,
            seccomp=bpf,
            proc=settings.proc,
            inotify_share=0 if as_root else inotify_share(settings.max_agents),
        )
    user = None if os.geteuid() == 0 else container_user(settings.data_dir)  # root: each group's own (for_identity)
    image, root, environ = settings.image, str(settings.data_dir), cli_env(os.environ)
    profiles = None
    if settings.seccomp == "required":
        try:
            profiles = await asyncio.to_thread(write_engine_profiles_sync, DataLayout(settings.data_dir))
        except SeccompUnavailable as err:
            raise SandboxError(err.message) from err
        logger.info("%s runs get farmhost's seccomp profile instead of the engine's default", runtime)
    else:
        logger.warning("FARMHOST_SANDBOX_SECCOMP=off: %s runs get the engine's default seccomp profile", runtime)
    if runtime == "podman":
        return PodmanBackend(image=image, user=user, data_root=root, environ=environ, seccomp_profiles=profiles,
                             rootless=os.geteuid() != 0)  # fmt: skip
    return DockerBackend(image=image, user=user, data_root=root, environ=environ, seccomp_profiles=profiles)


def write_engine_profiles_sync(layout: DataLayout) -> dict[tuple[int, ...], str]:
    """Write the seccomp profile of each socket family set into the host-private `run/`; returns their paths.

    The engine's CLI reads the file and hands its text to the engine, so it must be a file the daemon can read.
    """
    layout.run.mkdir(mode=0o700, exist_ok=True)
    paths: dict[tuple[int, ...], str] = {}
    for families in SOCKET_FAMILY_SETS:
        path = layout.run / f"seccomp-{'-'.join(str(family) for family in families)}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(engine_profile(families), indent=1))
        os.replace(temporary, path)
        paths[families] = str(path)
    return paths


async def cleanup_orphans(backend: SandboxBackend) -> int:
    """Remove containers left by an earlier daemon of this data dir (docker/podman); returns how many."""
    if not isinstance(backend, DockerBackend):
        return 0  # bwrap and process runs die with the daemon (--die-with-parent, or the session)
    listing, remove = backend.orphan_commands()
    out = await _engine(listing)
    if out is None:
        return 0
    ids = out.split()
    if ids and await _engine((*remove, *ids)) is not None:
        logger.warning("removed %d agent container(s) left by an earlier run of farmhost", len(ids))
        return len(ids)
    return 0


async def _engine(argv: tuple[str, ...]) -> str | None:
    """Run an engine command; None (logged) when the engine is absent or refuses."""
    return await engine_command(argv, doing="clean up old agent containers", level=logging.WARNING)
