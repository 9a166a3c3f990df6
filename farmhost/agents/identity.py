"""AgentIdentity: the unprivileged host uid/gid every agent run gets, and handing a run's directories to it.

A daemon that runs as root must never give its uid to an agent: uid 0 inside a user namespace that root
created is host root for files (a setuid-root program left in the workspace works for any host user). So
agent runs get a dedicated user (`farmagent` when it exists), else `nobody`, or `FARMHOST_AGENT_UID`; a
daemon that is not root runs agents as itself, an unprivileged user already. Before a run the host gives the
run's writable directories to that uid, and around each run it clears setuid/setgid bits the agent set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.treewalk import clear_setid_at, walk_sync
from farmhost.config import Settings
from farmhost.errors import ConfigError

logger = logging.getLogger(__name__)

DEDICATED_USER: Final = "farmagent"
NOBODY: Final = 65534


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

    Also clears setuid/setgid bits on regular files in `trees` and measures them, at any depth (treewalk). Links
    are never followed. Blocking: call it in a thread while no run of the group is active. Returns the bytes on
    disk of each tree.
    """
    sizes = [_take_tree(identity, tree) for tree in trees]
    for top in tops:
        with contextlib.suppress(FileNotFoundError):
            _own_at(identity, None, str(top), os.lstat(top))
        with contextlib.suppress(FileNotFoundError), os.scandir(top) as entries:
            for found in entries:
                if found.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        _own_at(identity, None, found.path, found.stat(follow_symlinks=False))
    return sizes


def clear_setid_sync(trees: Iterable[Path]) -> int:
    """Clear setuid/setgid bits on every regular file in `trees`, at any depth (after a run); returns how many."""
    return sum(_clear_tree(tree) for tree in trees)


def _take_tree(identity: AgentIdentity | None, tree: Path) -> int:
    """Hand one tree over and clear its setid bits; returns its bytes on disk (directories not counted)."""
    size = 0

    def take(dir_fd: int, name: str, entry: os.stat_result) -> None:
        nonlocal size
        _own_at(identity, dir_fd, name, entry)
        if not stat.S_ISDIR(entry.st_mode):
            size += entry.st_blocks * 512
        if clear_setid_at(dir_fd, name, entry):
            logger.warning("%s: cleared the setuid/setgid bits an agent set on %s", tree, name)

    with contextlib.suppress(FileNotFoundError):
        _own_at(identity, None, str(tree), os.lstat(tree))
    walk_sync(tree, take)
    return size


def _clear_tree(tree: Path) -> int:
    cleared = 0

    def clear(dir_fd: int, name: str, entry: os.stat_result) -> None:
        nonlocal cleared
        if clear_setid_at(dir_fd, name, entry):
            cleared += 1
            logger.warning("%s: cleared the setuid/setgid bits an agent set on %s", tree, name)

    walk_sync(tree, clear)
    return cleared


def _own_at(identity: AgentIdentity | None, dir_fd: int | None, name: str, entry: os.stat_result) -> None:
    """Give an entry to the agent (when it is another uid) without following links."""
    if identity is None or not identity.switch or (entry.st_uid, entry.st_gid) == (identity.uid, identity.gid):
        return
    with contextlib.suppress(FileNotFoundError):
        os.chown(name, identity.uid, identity.gid, dir_fd=dir_fd, follow_symlinks=False)
