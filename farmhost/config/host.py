"""What the machine decides of the settings, asked once when they are loaded: the zone, the runtime, the host name."""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Final
from zoneinfo import ZoneInfo

from farmhost.config.agents import RuntimeName

DOCKER_SOCKET: Final = Path("/var/run/docker.sock")  # where a local Docker engine listens by default


def farm_zone(tz: str | None) -> ZoneInfo:
    """The farm's time zone: `tz` (TZ, already checked to be a known zone), else the system's, else UTC."""
    if tz:
        return ZoneInfo(tz)
    from tzlocal import get_localzone

    local = get_localzone()
    return local if isinstance(local, ZoneInfo) else ZoneInfo("UTC")


def detect_runtime() -> RuntimeName:
    """The runtime when FARMHOST_AGENT_RUNTIME is unset: docker when its CLI and an engine are there, else bwrap."""
    return default_runtime(
        docker_cli=shutil.which("docker"), docker_host=os.environ.get("DOCKER_HOST"), socket=DOCKER_SOCKET
    )


def default_runtime(*, docker_cli: str | None, docker_host: str | None, socket: Path) -> RuntimeName:
    """The runtime when none is configured, from what the host has: `docker` or `bwrap`.

    Docker needs its CLI (`docker_cli`, the program found on PATH) and an engine: DOCKER_HOST set, or a Unix
    socket at `socket`. A docker CLI without an engine (common on CI machines) must not make every agent run fail.
    """
    if not docker_cli:
        return "bwrap"
    if docker_host:
        return "docker"
    try:
        return "docker" if stat.S_ISSOCK(os.stat(socket).st_mode) else "bwrap"
    except OSError:
        return "bwrap"


def host_name() -> str:
    """The machine's host name (a site's name when FARMHOST_SITE is unset)."""
    return socket.gethostname()
