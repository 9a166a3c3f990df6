"""Walking an agent's directory tree at any depth, relative to descriptors, never following a link.

An agent may nest directories far deeper than PATH_MAX (4,096 bytes): a walk by path names (os.walk) never sees
what is below that depth, and a call on such a path fails with "File name too long". This walk holds one directory
descriptor at a time and names every entry relative to it, so depth costs nothing but the names it remembers; it
climbs back through `..`, checking that it lands on the directory it came from. It is meant for trees no process
changes meanwhile (before and after a group's run, while none of its processes lives).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Final

from farmhost.files import WALK_DIR_FLAGS

logger = logging.getLogger(__name__)

_SETID: Final = stat.S_ISUID | stat.S_ISGID

# visit(dir_fd, name, lstat of the entry): called for every entry below the top, a directory before what it holds.
Visit = Callable[[int, str, os.stat_result], None]


class TreeChanged(OSError):
    """The tree moved while the host walked it (a directory is not where the walk left it)."""


def walk_sync(top: Path, visit: Visit) -> None:
    """Call `visit` for every entry below `top` (not `top` itself), at any depth; blocking, call it in a thread.

    A directory the daemon cannot open is opened after giving its owner (the daemon itself) access; one of
    another owner is skipped with a warning.

    Raises:
        TreeChanged: the tree moved under the walk.
        OSError: `top` or an entry cannot be read for another reason.
    """
    try:
        fd = os.open(top, WALK_DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        here = os.fstat(fd)
        pending: list[list[str]] = [os.listdir(fd)]  # names still to visit, per level
        path: list[tuple[int, int]] = [(here.st_dev, here.st_ino)]  # the directory of each level
        while pending:
            if not pending[-1]:
                pending.pop()
                path.pop()
                if pending:
                    fd = _replace(fd, os.open("..", WALK_DIR_FLAGS, dir_fd=fd))
                    _check(fd, path[-1], top)
                continue
            name = pending[-1].pop()
            try:
                entry = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            visit(fd, name, entry)
            if stat.S_ISDIR(entry.st_mode):
                below = _open_dir(fd, name, entry, top)
                if below is not None:
                    fd = _replace(fd, below)
                    _check(fd, (entry.st_dev, entry.st_ino), top)
                    pending.append(os.listdir(fd))
                    path.append((entry.st_dev, entry.st_ino))
    finally:
        os.close(fd)


def clear_setid_at(dir_fd: int, name: str, entry: os.stat_result) -> bool:
    """Clear the setuid/setgid bits of a regular file; returns whether it had any.

    Through an O_PATH descriptor: a link is never followed, and a file nobody may read is cleared too.
    """
    if not stat.S_ISREG(entry.st_mode) or not entry.st_mode & _SETID:
        return False
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & _SETID:
            return False
        os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(info.st_mode) & ~_SETID)  # an O_PATH descriptor has no fchmod
    finally:
        os.close(fd)
    return True


def _open_dir(fd: int, name: str, entry: os.stat_result, top: Path) -> int | None:
    try:
        return os.open(name, WALK_DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except PermissionError:
        if entry.st_uid != os.geteuid():
            logger.warning("%s: cannot enter a directory of uid %d below it; not walked", top, entry.st_uid)
            return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced by a link or a file since the stat
            raise TreeChanged(errno.ESTALE, f"{top} changed while the host walked it") from err
        raise
    # The daemon's own directory with its access taken away (a non-root daemon's runs keep its uid): give it back.
    os.chmod(name, stat.S_IMODE(entry.st_mode) | stat.S_IRWXU, dir_fd=fd)
    return os.open(name, WALK_DIR_FLAGS, dir_fd=fd)


def _replace(old: int, new: int) -> int:
    os.close(old)
    return new


def _check(fd: int, expected: tuple[int, int], top: Path) -> None:
    info = os.fstat(fd)
    if (info.st_dev, info.st_ino) != expected:
        raise TreeChanged(errno.ESTALE, f"{top} changed while the host walked it")
