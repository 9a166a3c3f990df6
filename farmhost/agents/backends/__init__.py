"""Sandbox backends, one module each, and the factory that picks one from the settings."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from farmhost.agents.backends.base import (
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
from farmhost.agents.backends.bwrap import BwrapBackend
from farmhost.agents.backends.docker import DockerBackend, cli_env
from farmhost.agents.backends.engine_cli import engine_command
from farmhost.agents.backends.host import find_python_install_sync, system_entries
from farmhost.agents.backends.podman import PodmanBackend
from farmhost.agents.backends.process import ProcessBackend
from farmhost.agents.identity import AgentIdentity, agent_identity, unprivileged_identity
from farmhost.agents.seccomp import SeccompUnavailable, engine_profile, filter_for
from farmhost.config import Settings
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
    "run_identity",
]

logger = logging.getLogger(__name__)


def container_user(settings: Settings) -> tuple[int, int]:
    """The uid:gid of docker/podman runs: FARMHOST_AGENT_UID, else the data directory's owner unless that is root."""
    info = os.stat(settings.data_dir)
    if settings.agent_uid is not None or info.st_uid == 0:
        identity = unprivileged_identity(settings)
        return identity.uid, identity.gid
    return info.st_uid, info.st_gid


def run_identity(backend: SandboxBackend) -> AgentIdentity | None:
    """Who the backend's agent processes are on the host (None: the daemon itself, the `process` runtime)."""
    if isinstance(backend, BwrapBackend):
        return backend.identity
    if isinstance(backend, DockerBackend):  # podman too
        uid, gid = backend.user
        return AgentIdentity(uid=uid, gid=gid, switch=os.geteuid() == 0 and uid != 0)
    return None


async def create_backend(settings: Settings) -> SandboxBackend:
    """The backend of `settings.runtime`, with what it needs of the host looked up once.

    Raises:
        SandboxError: the runtime's program is missing, the agent interpreter cannot be inspected, or bwrap's
            seccomp filter cannot be built while FARMHOST_SANDBOX_SECCOMP is `required`.
    """
    runtime = settings.runtime
    if runtime == "process":
        logger.warning("agent runtime 'process': agents run WITHOUT isolation (development only)")
        return ProcessBackend(python=settings.agent_python or Path(sys.executable))
    binary = shutil.which(runtime)
    if binary is None:
        raise SandboxError(f"agent runtime {runtime!r}: {runtime} is not installed (or set FARMHOST_AGENT_RUNTIME)")
    if runtime == "bwrap":
        python = await asyncio.to_thread(find_python_install_sync, settings.agent_python)
        if python.farmagent is None:
            logger.error("the agent interpreter %s cannot import farmagent; agent runs will fail", python.executable)
        identity = agent_identity(settings)
        setpriv = shutil.which("setpriv")
        if identity.switch:
            logger.info("agent runs drop to %s (the daemon is root)", identity.describe())
        try:
            filters = await asyncio.to_thread(filter_for, settings.sandbox_seccomp)
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
        )
    user = container_user(settings)
    image, root, environ = settings.agent_image, str(settings.data_dir), cli_env(os.environ)
    profiles = None
    if settings.sandbox_seccomp == "required":
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
