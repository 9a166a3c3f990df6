"""TreeJournal: one directory tree kept walked between runs, re-walking only the directories the kernel saw change.

A walk of a group's whole workspace before and after every run cost seconds once it held hundreds of thousands of
files (issue 33). The journal walks a tree once, remembers what each directory holds (its entries' bytes and count,
its subdirectories) and puts an inotify watch on each directory. The kernel then names every directory in which
an entry was created, deleted, moved, written, truncated, closed after writing or had its mode, owner or extended
attributes changed, through any mount of it (the run's binds are the same inodes). The next sync reads those
names and re-walks only those directories, and any directory that is new below them whole; everything else is
known unchanged. An event lost (the kernel's queue overflowed), a watch refused (the uid's watches are used up), a
tree deeper than the limit or one that moved under the walk drop the journal: the caller walks in full instead.
Only for trees no process changes during the sync (before and after a group's run).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from farmhost.files import WALK_DIR_FLAGS

logger = logging.getLogger(__name__)

# <sys/inotify.h>
_IN_MODIFY: Final = 0x002
_IN_ATTRIB: Final = 0x004
_IN_CLOSE_WRITE: Final = 0x008
_IN_MOVED_FROM: Final = 0x040
_IN_MOVED_TO: Final = 0x080
_IN_CREATE: Final = 0x100
_IN_DELETE: Final = 0x200
_IN_DELETE_SELF: Final = 0x400
_IN_MOVE_SELF: Final = 0x800
_IN_Q_OVERFLOW: Final = 0x4000
_IN_IGNORED: Final = 0x8000
_IN_ONLYDIR: Final = 0x01000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
# Everything that can change what a directory's entries hold on disk or their mode: writes through mmap show as
# the close after writing (every process of a run has ended before the sync), truncate and fallocate as modify.
_WATCH: Final = (
    _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
    | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
)  # fmt: skip
_EVENT: Final = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
# Bytes read from the inotify descriptor at a time: 1,000 events with short names.
_READ_SIZE: Final = 64 * 1024

# visit(dir_fd, name, lstat, depth): every entry walked (depth 1: directly in the top), a directory before what it holds.
JournalVisit = Callable[[int, str, os.stat_result, int], None]
Key = tuple[int, int]  # a directory's (st_dev, st_ino)


class JournalLost(Exception):
    """The journal no longer knows the tree (an event lost, a watch refused, too deep, moved under the walk)."""


@dataclass(kw_only=True, slots=True)
class _Dir:
    """What the journal knows of one directory (mutable: updated in place as the directory changes)."""

    parent: Key | None
    name: str  # its name in its parent (the top: "")
    depth: int  # the top: 0
    wd: int = -1  # its inotify watch (-1: not yet watched)
    bytes: int = 0  # on disk, of its entries (not what they hold)
    files: int = 0  # its entries
    subdirs: dict[str, Key] = field(default_factory=dict)


class TreeJournal:
    """One tree (a group's workspace, its IPC directory) and the running totals of what it holds."""

    def __init__(self, top: Path, *, max_depth: int, max_files: int) -> None:
        """Journal `top`; not kept when deeper than `max_depth` or found over `max_files` entries by its first walk."""
        self.top = top
        self._max_depth = max_depth
        self._max_files = max_files
        self._fd: int | None = None
        self._dirs: dict[Key, _Dir] = {}
        self._by_wd: dict[int, Key] = {}
        self.bytes = 0
        self.files = 0
        self.walked = 0  # entries visited by the last sync (for the figures and the tests)
        self._building = False

    @property
    def kept(self) -> bool:
        """Whether the journal holds the tree (else the next sync walks it whole)."""
        return self._fd is not None

    def close(self) -> None:
        """Forget the tree and drop every watch."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._dirs.clear()
        self._by_wd.clear()
        self.bytes = self.files = 0

    def sync(self, visit: JournalVisit) -> None:
        """Bring the totals up to date, calling `visit` on every entry of each directory that changed.

        The first sync (or one after the journal was lost) walks the whole tree. Blocking: call it in a thread,
        while no process changes the tree.

        Raises:
            JournalLost: the journal could not follow the tree; it is closed (walk the tree another way).
            OSError: the tree cannot be read.
        """
        self.walked = 0
        try:
            if self._fd is None:
                self._building = True
                self._build(visit)
                if self.files > self._max_files:
                    raise JournalLost(f"{self.top} holds over {self._max_files} entries")
            else:
                self._update(visit)
        except BaseException:
            self.close()
            raise
        finally:
            self._building = False

    def _build(self, visit: JournalVisit) -> None:
        self._fd = _inotify_init()
        fd = os.open(self.top, WALK_DIR_FLAGS)
        try:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino)
            self._dirs[key] = _Dir(parent=None, name="", depth=0)
            self._scan(fd, key, visit)
        finally:
            os.close(fd)

    def _update(self, visit: JournalVisit) -> None:
        changed = self._read_events()
        # Shallow first: a directory renamed or deleted is dropped with all below it by its parent's re-walk, so
        # every directory still known after that is where its chain of names says.
        for key in sorted(changed, key=lambda k: self._dirs[k].depth if k in self._dirs else 0):
            if key not in self._dirs:
                continue
            fd = self._open(key)
            try:
                self._scan(fd, key, visit)
            finally:
                os.close(fd)

    def _read_events(self) -> set[Key]:
        assert self._fd is not None
        changed: set[Key] = set()
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return changed
            offset = 0
            while offset < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + size
                if mask & _IN_Q_OVERFLOW:
                    raise JournalLost(f"{self.top}: the kernel dropped change events (its queue overflowed)")
                key = self._by_wd.get(wd)
                if key is None:
                    continue
                if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                    parent = self._dirs[key].parent if key in self._dirs else None
                    if parent is None and key in self._dirs:
                        raise JournalLost(f"{self.top} itself was moved or deleted")
                    if parent is not None:
                        changed.add(parent)
                    continue
                changed.add(key)

    def _scan(self, fd: int, key: Key, visit: JournalVisit) -> None:
        """Re-walk one directory's entries, and whole every subdirectory the journal does not know."""
        here = self._dirs[key]
        old_subdirs = here.subdirs
        self.bytes -= here.bytes
        self.files -= here.files
        here.bytes = here.files = 0
        here.subdirs = {}
        before = os.fstat(fd) if here.wd < 0 else None
        new: list[tuple[str, Key]] = []
        for name in os.listdir(fd):
            try:
                entry = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            self.walked += 1
            if entry.st_nlink > 1 and not stat.S_ISDIR(entry.st_mode):
                # Written through its other name, its size would change where no event names this directory.
                raise JournalLost(f"{self.top} holds a file with more than one name (a hard link)")
            visit(fd, name, entry, here.depth + 1)
            here.bytes += entry.st_blocks * 512
            here.files += 1
            if self._building and self.files + here.files > self._max_files:  # a first walk costs at most the limit
                raise JournalLost(f"{self.top} holds over {self._max_files} entries")
            if stat.S_ISDIR(entry.st_mode):
                child = (entry.st_dev, entry.st_ino)
                here.subdirs[name] = child
                if old_subdirs.get(name) != child or child not in self._dirs:
                    new.append((name, child))
        self.bytes += here.bytes
        if before is not None:
            # Watched once its entries were visited, so that the hand-over's own chowns raise no events (tens of
            # thousands overflow the kernel's queue); an entry added or removed meanwhile shows in the times.
            here.wd = self._watch(fd)
            self._by_wd[here.wd] = key
            after = os.fstat(fd)
            if (before.st_mtime_ns, before.st_ctime_ns) != (after.st_mtime_ns, after.st_ctime_ns):
                raise JournalLost(f"{self.top} changed while the host walked it")
        self.files += here.files
        for name, child in old_subdirs.items():
            known = self._dirs.get(child)
            # Unless it was moved and is already known under its new parent (re-walked before this one).
            if here.subdirs.get(name) != child and known is not None and known.parent == key:
                self._drop(child)
        for name, child in new:
            self._drop(child)  # moved here from elsewhere in the tree: known under its old place
            self._enter(fd, key, name, child, visit)

    def _enter(self, fd: int, parent: Key, name: str, child: Key, visit: JournalVisit) -> None:
        """Walk a subdirectory the journal does not know, whole, and watch it."""
        depth = self._dirs[parent].depth + 1
        if self._building and self.files > self._max_files:  # a first walk costs at most the limit
            raise JournalLost(f"{self.top} holds over {self._max_files} entries")
        if depth > self._max_depth:
            raise JournalLost(f"{self.top} holds a tree deeper than {self._max_depth} directories")
        try:
            below = os.open(name, WALK_DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise JournalLost(f"{self.top} changed while the host walked it") from err
            raise
        try:
            info = os.fstat(below)
            if (info.st_dev, info.st_ino) != child:
                raise JournalLost(f"{self.top} changed while the host walked it")
            self._dirs[child] = _Dir(parent=parent, name=name, depth=depth)
            self._scan(below, child, visit)
        finally:
            os.close(below)

    def _drop(self, key: Key) -> None:
        """Forget a directory and everything below it (it was deleted or moved)."""
        gone = self._dirs.pop(key, None)
        if gone is None:
            return
        self.bytes -= gone.bytes
        self.files -= gone.files
        if self._by_wd.get(gone.wd) == key:
            del self._by_wd[gone.wd]
        for child in gone.subdirs.values():
            self._drop(child)

    def _open(self, key: Key) -> int:
        """Open a known directory by descriptors along its chain of names from the top, checking each step."""
        chain: list[tuple[str, Key]] = []
        at: Key | None = key
        while at is not None and self._dirs[at].parent is not None:
            chain.append((self._dirs[at].name, at))
            at = self._dirs[at].parent
        fd = os.open(self.top, WALK_DIR_FLAGS)
        try:
            for name, expected in reversed(chain):
                below = os.open(name, WALK_DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) != expected:
                    raise JournalLost(f"{self.top} changed while the host walked it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _watch(self, dir_fd: int) -> int:
        """Watch an open directory (by its descriptor: no path, so any depth; the link is the kernel's own)."""
        assert self._fd is not None
        wd = _LIBC.inotify_add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), _WATCH)
        if wd < 0:
            code = ctypes.get_errno()
            raise JournalLost(f"{self.top}: the kernel refused a watch ({os.strerror(code)})")
        return int(wd)


def _inotify_init() -> int:
    fd = int(_LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        code = ctypes.get_errno()
        raise JournalLost(f"no inotify instance ({os.strerror(code)})")
    return fd


_LIBC: Final = ctypes.CDLL(None, use_errno=True)
_LIBC.inotify_init1.argtypes = [ctypes.c_int]
_LIBC.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
