"""AgentIdentity: the unprivileged host uid/gid every agent run gets, and handing a run's directories to it.

A daemon that runs as root must never give its uid to an agent: uid 0 inside a user namespace that root
created is host root for files (a setuid-root program left in the workspace works for any host user). So
agent runs get a dedicated user (`farmagent` when it exists), else `nobody`, or `FARMHOST_AGENT_UID`; a
daemon that is not root runs agents as itself, an unprivileged user already. Before a run the host gives the
run's writable directories to that uid, and around each run it clears setuid/setgid bits the agent set.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.config import Settings
from farmhost.errors import ConfigError

logger = logging.getLogger(__name__)

DEDICATED_USER: Final = "farmagent"
NOBODY: Final = 65534
_SETID: Final = stat.S_ISUID | stat.S_ISGID
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, kw_only=True)
class AgentIdentity:
    """Who agent processes are on the host."""

    uid: int
    gid: int
    switch: bool  # the daemon is root: runs must drop to uid:gid before the agent starts

    def describe(self) -> str:
        """`uid 65534 (nobody)`-style text for logs and the doctor."""
        try:
            name = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            name = "no user name"
        return f"uid {self.uid} ({name}), gid {self.gid}"


def agent_identity(settings: Settings) -> AgentIdentity:
    """The identity of agent runs under this daemon: its own uid unless it is root.

    Raises:
        ConfigError: FARMHOST_AGENT_UID is 0.
    """
    if os.geteuid() != 0:
        return AgentIdentity(uid=os.geteuid(), gid=os.getegid(), switch=False)
    return unprivileged_identity(settings)


def unprivileged_identity(settings: Settings) -> AgentIdentity:
    """FARMHOST_AGENT_UID, else the `farmagent` user, else `nobody`: never uid 0.

    Raises:
        ConfigError: FARMHOST_AGENT_UID is 0.
    """
    if settings.agent_uid is not None:
        if settings.agent_uid == 0:
            raise ConfigError("FARMHOST_AGENT_UID=0 would run agents as host root; choose an unprivileged uid")
        return AgentIdentity(uid=settings.agent_uid, gid=settings.agent_uid, switch=True)
    for name in (DEDICATED_USER, "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            if entry.pw_uid != 0:
                return AgentIdentity(uid=entry.pw_uid, gid=entry.pw_gid, switch=True)
    return AgentIdentity(uid=NOBODY, gid=NOBODY, switch=True)


def hand_over_sync(identity: AgentIdentity | None, trees: Iterable[Path], tops: Iterable[Path]) -> list[int]:
    """Give `trees` (recursively) and `tops` (the directory and its subdirectories) to the agent's uid.

    Also clears setuid/setgid bits on regular files in `trees` and measures them. Links are never followed.
    Blocking: call it in a thread while no run of the group is active. Returns the bytes on disk of each tree.
    """
    sizes = []
    for tree in trees:
        size = 0
        for current, dirs, files in os.walk(tree, followlinks=False):
            _own(identity, Path(current))
            for name in dirs:
                _own(identity, Path(current, name))
            for name in files:
                path = Path(current, name)
                size += _own(identity, path)
                _clear_setid(path)
        sizes.append(size)
    for top in tops:
        _own(identity, top)
        with contextlib.suppress(FileNotFoundError), os.scandir(top) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    _own(identity, Path(entry.path))
    return sizes


def clear_setid_sync(trees: Iterable[Path]) -> int:
    """Clear setuid/setgid bits on every regular file in `trees` (after a run); returns how many it cleared."""
    cleared = 0
    for tree in trees:
        for current, _dirs, files in os.walk(tree, followlinks=False):
            for name in files:
                cleared += _clear_setid(Path(current, name))
    return cleared


def _own(identity: AgentIdentity | None, path: Path) -> int:
    """Give an entry to the agent (when it is another uid) without following links; returns the entry's bytes on disk."""
    try:
        info = os.lstat(path)
        if identity is not None and identity.switch and (info.st_uid, info.st_gid) != (identity.uid, identity.gid):
            os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    return info.st_blocks * 512


def _clear_setid(path: Path) -> int:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOENT, errno.ENXIO, errno.EACCES):
            return 0  # a link, gone, a socket or FIFO without reader: nothing to execute
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_mode & _SETID:
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~_SETID)
            logger.warning("%s: cleared the setuid/setgid bits an agent set", path)
            return 1
    finally:
        os.close(fd)
    return 0
