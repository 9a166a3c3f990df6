"""Who agent runs are on the host: a uid and gid of their group's own, and handing a run's directories to it.

A daemon that runs as root must never give its uid to an agent (uid 0 inside a user namespace root created is host
root for files), and groups must not share one: RLIMIT_NPROC and inotify instances are counted per uid, files are
owned per uid, and a group's IPC queue belongs to its uid. So a root daemon gives each group a uid (gid the same
number) from FARMHOST_AGENT_UID_BASE.., recorded in the agent_ids table: a group keeps it across restarts, and an id
is never given to another group (rows are never deleted), nor one a host user, group or subordinate range holds. A
daemon that is not root cannot switch uids (docs/security.md#one-identity-per-group): its runs share its own uid.
Before a run the host gives the run's writable directories to the group's uid, and around each run it clears
setuid/setgid bits the agent set.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.share import inotify_share
from farmhost.agents.sandbox.treewalk import clear_setid_at, walk_sync
from farmhost.config import SandboxSettings
from farmhost.errors import FarmhostError
from farmhost.store import agent_ids
from farmhost.store.db import Database, now_utc

logger = logging.getLogger(__name__)

# Where the system lists the subordinate ids it gave to users (for their user namespaces: podman, LXD, docker's
# userns-remap); an agent id inside one would be another user's container's.
SUBORDINATE_FILES: Final = (Path("/etc/subuid"), Path("/etc/subgid"))


class IdentityError(FarmhostError):
    """A group's runs cannot get an identity of their own (the range is used up, a host user took the id)."""


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


@dataclass(frozen=True, kw_only=True)
class IdRange:
    """The ids a root daemon gives groups: [base, base + count)."""

    base: int
    count: int

    @classmethod
    def of(cls, settings: SandboxSettings) -> IdRange:
        """FARMHOST_AGENT_UID_BASE and FARMHOST_AGENT_UID_COUNT."""
        return cls(base=settings.uid_base, count=settings.uid_count)

    @property
    def last(self) -> int:
        """The highest id of the range."""
        return self.base + self.count - 1


def subordinate_ranges() -> list[tuple[str, int, int]]:
    """(file: user, first, last) of every range in /etc/subuid and /etc/subgid (absent files: none)."""
    ranges = []
    for path in SUBORDINATE_FILES:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text(errors="replace").splitlines():
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    first = int(parts[1])
                    ranges.append((f"{path}: {parts[0]}", first, first + int(parts[2]) - 1))
    return ranges


def host_claim(number: int, subordinate: list[tuple[str, int, int]]) -> str | None:
    """What on the host already holds `number` as a uid or gid (a user, a group, a subordinate range), else None."""
    with contextlib.suppress(KeyError):
        return f"user {pwd.getpwuid(number).pw_name}"
    with contextlib.suppress(KeyError):
        return f"group {grp.getgrgid(number).gr_name}"
    for owner, first, last in subordinate:
        if first <= number <= last:
            return f"the subordinate ids {first}-{last} of {owner}"
    return None


def range_claims(ids: IdRange) -> list[str]:
    """What on the host holds ids inside `ids` (allocation skips those ids; the doctor names them)."""
    claims = [f"the subordinate ids {a}-{b} of {owner}" for owner, a, b in subordinate_ranges()
              if a <= ids.last and b >= ids.base]  # fmt: skip
    claims += [f"user {e.pw_name} ({e.pw_uid})" for e in pwd.getpwall() if ids.base <= e.pw_uid <= ids.last]
    claims += [f"group {e.gr_name} ({e.gr_gid})" for e in grp.getgrall() if ids.base <= e.gr_gid <= ids.last]
    return claims


def allocate_sync(data_dir: Path, folder: str, ids: IdRange) -> AgentIdentity:
    """The identity of `folder`'s runs under a root daemon: its recorded uid, else a new one, recorded durably.

    Blocking (SQLite, /etc files): call it in a thread.

    Raises:
        IdentityError: the range is used up, or a host user, group or subordinate range now holds the group's id.
    """
    subordinate = subordinate_ranges()
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            uid = agent_ids.allocate(
                conn,
                folder,
                base=ids.base,
                count=ids.count,
                taken=lambda number: host_claim(number, subordinate) is not None,
                now=now_utc(),
            )
    except agent_ids.IdRangeExhausted as err:
        raise IdentityError(
            f"group {folder!r} gets no uid of its own: {err.message}; "
            "widen FARMHOST_AGENT_UID_COUNT or move FARMHOST_AGENT_UID_BASE (docs/security.md)"
        ) from err
    finally:
        db.close()
    claim = host_claim(uid, subordinate)
    if claim is not None or uid == os.geteuid():
        raise IdentityError(
            f"group {folder!r}'s agent uid {uid} is now held by {claim or 'the daemon'} on this host; "
            "its runs are refused until that id is freed (docs/security.md#one-identity-per-group)"
        )
    return AgentIdentity(uid=uid, gid=uid, switch=True)


class GroupIds:
    """The identity of each group's runs: allocated per group (root daemon), or one for all (the daemon's own)."""

    def __init__(self, *, data_dir: Path, per_group: IdRange | None, shared: AgentIdentity | None) -> None:
        """`per_group`: allocate from this range; else every run is `shared` (None: the daemon itself, unchanged)."""
        self._data_dir = data_dir
        self.per_group = per_group
        self.shared = shared
        self._known: dict[str, AgentIdentity] = {}

    async def identity(self, folder: str) -> AgentIdentity | None:
        """Who `folder`'s runs are (allocated and recorded at its first run).

        Raises:
            IdentityError: the group cannot get an identity of its own.
        """
        if self.per_group is None:
            return self.shared
        known = self._known.get(folder)
        if known is None:
            known = await asyncio.to_thread(allocate_sync, self._data_dir, folder, self.per_group)
            self._known[folder] = known
            logger.info("group %s: agent runs are %s", folder, known.describe())
        return known


def daemon_identity() -> AgentIdentity:
    """The daemon's own uid and gid (a daemon that is not root runs its agents as itself)."""
    return AgentIdentity(uid=os.geteuid(), gid=os.getegid(), switch=False)


def describe_ids(settings: SandboxSettings) -> str:
    """The doctor's sentence on who agents are: per-group uids (root daemon), or the daemon's own shared uid."""
    runtime = settings.runtime
    if runtime == "process":
        return "agents run as the daemon itself (runtime process, no isolation)"
    if os.geteuid() == 0:
        ids = IdRange.of(settings)
        claims = range_claims(ids)
        skipped = f"; skipped as the host holds them: {', '.join(claims)}" if claims else ""
        return f"agents run as per-group uids {ids.base}..{ids.last} (root daemon, gid = uid){skipped}"
    if runtime != "bwrap":
        return (
            "agents share one uid, the data directory's owner: a daemon that is not root cannot give each group "
            "its own (docs/security.md#one-identity-per-group); the engine holds each container's processes"
        )
    return (
        f"agents share the daemon's {daemon_identity().describe()}: a daemon that is not root cannot give each group "
        "its own (file ownership and the IPC queues are that uid's; docs/security.md#one-identity-per-group); each "
        f"run's processes and inotify instances ({inotify_share(settings.max_agents)}) are capped in its own user "
        "namespace"
    )


def hand_over_sync(identity: AgentIdentity | None, trees: Iterable[Path], tops: Iterable[Path]) -> list[int]:
    """Give `trees` (recursively) and `tops` (the directory and its subdirectories) to the agent's uid.

    Also clears setuid/setgid bits on regular files in `trees` and measures them, at any depth (treewalk). Links
    are never followed. Blocking: call it in a thread while no run of the group is active. Returns the bytes on
    disk of each tree.
    """
    sizes = [_take_tree(identity, tree) for tree in trees]
    for top in tops:
        with contextlib.suppress(FileNotFoundError):
            own_at(identity, None, str(top), os.lstat(top))
        with contextlib.suppress(FileNotFoundError), os.scandir(top) as entries:
            for found in entries:
                if found.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        own_at(identity, None, found.path, found.stat(follow_symlinks=False))
    return sizes


def clear_setid_sync(trees: Iterable[Path]) -> int:
    """Clear setuid/setgid bits on every regular file in `trees`, at any depth (after a run); returns how many."""
    return sum(_clear_tree(tree) for tree in trees)


def _take_tree(identity: AgentIdentity | None, tree: Path) -> int:
    """Hand one tree over and clear its setid bits; returns its bytes on disk (directories not counted)."""
    size = 0

    def take(dir_fd: int, name: str, entry: os.stat_result) -> None:
        nonlocal size
        own_at(identity, dir_fd, name, entry)
        if not stat.S_ISDIR(entry.st_mode):
            size += entry.st_blocks * 512
        if clear_setid_at(dir_fd, name, entry):
            logger.warning("%s: cleared the setuid/setgid bits an agent set on %s", tree, name)

    with contextlib.suppress(FileNotFoundError):
        own_at(identity, None, str(tree), os.lstat(tree))
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


def own_at(identity: AgentIdentity | None, dir_fd: int | None, name: str, entry: os.stat_result) -> None:
    """Give an entry to the agent (when it is another uid) without following links."""
    if identity is None or not identity.switch or (entry.st_uid, entry.st_gid) == (identity.uid, identity.gid):
        return
    with contextlib.suppress(FileNotFoundError):
        os.chown(name, identity.uid, identity.gid, dir_fd=dir_fd, follow_symlinks=False)
