"""Change detection for the memory roots of one corpus: inotify on the directories the listing walks.

A `MemoryWatch` owns one inotify instance for one corpus; a `RootWatch` per workspace root answers "may
anything under this root's memory have changed since it was last listed?", so a search lists a root (one
`stat` per file) only when the answer is yes. The first answer is always yes.

How it knows:

- `RootWatch.list()` walks the root (`files.walk_root`) and, just before each directory is read, adds a
  watch on it: the root (for `MEMORY.md` and `memory` being created, written, deleted, renamed or
  replaced), `memory/` and every directory under it that the walk enters. A file created after the walk
  started is therefore reported. The watch is added through `/proc/self/fd/<fd>` of the walk's own
  `O_NOFOLLOW | O_DIRECTORY` descriptor, so the kernel watches the directory the walk read, never what a
  path swapped for a symlink points to. Directories the walk no longer reached lose their watch.
- `MemoryWatch.poll()` drains the queue with one non-blocking `read` (`EAGAIN` when nothing happened). An
  event about `MEMORY.md` or `memory` in the root, about a `*.md` name or a directory below, or about a
  watched directory itself marks its root dirty; anything else (an agent's scratch files, run logs) is
  ignored. `IN_Q_OVERFLOW` marks every root dirty and `IN_IGNORED` its own; every listing re-adds the
  watches, so the next listing rebuilds the set.

When the watch cannot be trusted, the root is dirty at every check: each search re-lists it, as before
this module existed. Each cause is logged once:

- inotify cannot be used: `inotify_init` failed (`EMFILE`: `fs.inotify.max_user_instances` or the
  descriptor limit reached), a watch could not be added for lack of watches (`ENOSPC`:
  `fs.inotify.max_user_watches`), or the queue could not be read. The instance is closed, which frees
  its watches for the IPC watcher and agent runs.
- a watch could not be added for another reason (no `/proc`, say): that listing is not trusted, and the
  next one tries again.
- the root has more than MAX_WATCHED_DIRS directories to watch (an agent must not spend the user's
  watches); its watches are removed until it has fewer again.
- a memory file has `st_nlink > 1`: a hard link lets it be written through a directory that is not
  watched. Such a file is not searched (memory_get refuses it too), and the root is re-listed at every
  search while any file has one, so it is searched again as soon as it has one link again.
- the root does not exist (listing it is one failed `open`).

What inotify cannot see, and the bound on it: a store through a shared writable `mmap` of a memory file
produces no event, and a hard link made after a listing is reported to the file's own watchers, not its
directory's, so writes through it go unseen. The index may then be stale until the file's next ordinary
change (a `write`, truncate, rename or touch through the memory path) and at most REVALIDATE_SECONDS: a
root is re-listed at least that often anyway. The content is the agent's own; it can only mislead itself.
The sandboxes (docker, podman, bwrap, process) bind-mount the workspace, so their writes reach the same
inodes and are seen; a network or FUSE filesystem written from elsewhere is covered by the bound only.

Cost: one inotify instance (one descriptor) per corpus. `MemoryService` keeps one corpus per folder
searched, so a daemon holds at most one per registered group plus one for `global`, each counted against
`fs.inotify.max_user_instances` (128 by default) with the IPC watcher's one and one per agent run. Watches:
per root its directory, `memory/` and the directories below (at most MAX_WATCHED_DIRS), and the global
memory is watched again in each group's corpus. Not thread-safe: one thread at a time, as its corpus.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from inotify_simple import INotify, parse_events
from inotify_simple import flags as f

from farmhost.memory.files import MEMORY_DIR, MEMORY_FILE, Signature, is_memory_name, signature, walk_root

logger = logging.getLogger(__name__)

# A memory root with more directories than this falls back to re-listing at every search.
MAX_WATCHED_DIRS: Final = 128
# Even a trusted watch is re-checked this often: the bound on what inotify cannot see (mmap, late hard links).
REVALIDATE_SECONDS: Final = 30.0

_MASK: Final = (
    f.CREATE
    | f.DELETE
    | f.MODIFY
    | f.CLOSE_WRITE
    | f.MOVED_FROM
    | f.MOVED_TO
    | f.ATTRIB
    | f.DELETE_SELF
    | f.MOVE_SELF
    | f.ONLYDIR
    | f.EXCL_UNLINK
)
_READ_BYTES: Final = 64 * 1024
# struct inotify_event (16 bytes) plus the longest name the kernel pads (NAME_MAX + 1, rounded up).
_MAX_EVENT_BYTES: Final = 16 + 256 + 16


def _relevant(top: bool, mask: int, name: str) -> bool:
    """Whether an event on a watched directory can change what a listing finds."""
    if not name:
        return True  # the directory itself: deleted, moved, or its mode changed
    if top:
        return name in (MEMORY_FILE, MEMORY_DIR)
    return bool(mask & f.ISDIR) or is_memory_name(name)


class MemoryWatch:
    """The inotify instance of one corpus and the watch descriptors of its roots."""

    def __init__(
        self,
        name: str,
        *,
        revalidate_after: float = REVALIDATE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        inotify: bool = True,
    ) -> None:
        """Create the inotify instance; when that fails, every root stays dirty (logged once).

        Args:
            name: Who the corpus serves (a group folder), for the log lines.
            inotify: False for a corpus listed once (the builder process): no instance, every root always dirty.
            revalidate_after: A root is re-listed at least this often (seconds) even when no event came.
            clock: Monotonic seconds; tests pass their own to step over revalidate_after.
        """
        self.name = name
        self.revalidate_after = revalidate_after
        self.clock = clock
        self._roots: list[RootWatch] = []
        self._owners: dict[int, tuple[RootWatch, bool]] = {}  # wd -> (root, whether it is the root directory)
        self._warned: set[str] = set()
        self._inotify: INotify | None = None
        if not inotify:
            return
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as err:
            hint = " (fs.inotify.max_user_instances or the descriptor limit)" if err.errno == errno.EMFILE else ""
            self.warn_once("init", "cannot create an inotify instance: %s%s", err, hint)

    @property
    def active(self) -> bool:
        """Whether the inotify instance is open (not given up on, not closed)."""
        return self._inotify is not None

    def root(self, path: Path) -> RootWatch:
        """The watch of one more workspace root; dirty until its first listing."""
        watch = RootWatch(self, path)
        self._roots.append(watch)
        return watch

    def poll(self) -> None:
        """Mark dirty the roots that the queued events concern: one non-blocking read when nothing happened."""
        if self._inotify is None:
            return
        while True:
            try:
                data = os.read(self._inotify.fileno(), _READ_BYTES)
            except BlockingIOError:
                return
            except OSError as err:
                self._give_up("cannot read the inotify queue: %s", err)
                return
            for event in parse_events(data):
                self._dispatch(event.wd, event.mask, event.name)
            if len(data) <= _READ_BYTES - _MAX_EVENT_BYTES:
                return  # a short read: the queue was empty

    def close(self) -> None:
        """Close the inotify instance (idempotent); the roots then stay dirty."""
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._owners.clear()

    def warn_once(self, key: str, message: str, *args: object) -> None:
        """Log a fallback the first time it happens for this corpus, not at every search."""
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(
                "memory search for %s: " + message + "; it re-lists the files at every search", self.name, *args
            )

    def _dispatch(self, wd: int, mask: int, name: str) -> None:
        if mask & f.Q_OVERFLOW:
            for root in self._roots:
                root.changed = True
            return
        owner = self._owners.get(wd)
        if owner is None:
            return  # a watch removed since: its directory is no longer walked
        root, top = owner
        if mask & f.IGNORED:
            del self._owners[wd]
            root.changed = True
        elif _relevant(top, mask, name):
            root.changed = True

    def _give_up(self, message: str, *args: object) -> None:
        self.warn_once("give-up", message, *args)
        self.close()

    def add(self, dir_fd: int, root: RootWatch, top: bool) -> int | None:
        """Watch an open directory for `root`; its watch descriptor, or None when it cannot be watched."""
        if self._inotify is None:
            return None
        try:
            wd: int = self._inotify.add_watch(f"/proc/self/fd/{dir_fd}", _MASK)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                self._give_up("inotify watch limit reached (raise fs.inotify.max_user_watches)")
            else:
                self.warn_once(f"add:{err.errno}", "cannot watch a directory of %s: %s", root.path, err)
            return None
        owner = self._owners.get(wd)
        if owner is not None and owner[0] is not root:
            return None  # one directory in two roots: an event could not be told apart
        self._owners[wd] = (root, top)
        return wd

    def drop(self, root: RootWatch, keep: set[int]) -> None:
        """Remove the watches of `root` other than `keep`."""
        for wd in [wd for wd, (owner, _) in self._owners.items() if owner is root and wd not in keep]:
            del self._owners[wd]
            if self._inotify is not None:
                with contextlib.suppress(OSError):  # the kernel dropped it already (directory deleted)
                    self._inotify.rm_watch(wd)


class RootWatch:
    """Whether one workspace root's memory may have changed since its last listing, and that listing."""

    def __init__(self, hub: MemoryWatch, path: Path) -> None:
        """Use `MemoryWatch.root` rather than this."""
        self.path = path
        self.changed = True  # an event since the last listing (set by MemoryWatch.poll)
        self._hub = hub
        self._trusted = False  # the last listing left a complete watch and found no hard-linked file
        self._listed_at = 0.0
        self._too_many = False  # the last listing counted more than MAX_WATCHED_DIRS directories

    @property
    def trusted(self) -> bool:
        """Whether the watch covers the last listing (False: this root is re-listed at every search)."""
        return self._trusted and self._hub.active

    @property
    def dirty(self) -> bool:
        """Whether this root must be listed again: an event came, the watch is not trusted, or it is time."""
        if self.changed or not self.trusted:
            return True
        return self._hub.clock() - self._listed_at >= self._hub.revalidate_after

    def list(self) -> dict[str, Signature]:
        """List the memory files (`files.walk_root`), watching each directory before it is read."""
        self.changed = False
        self._listed_at = self._hub.clock()
        hub = self._hub
        watching = hub.active and not self._too_many
        complete = True
        dirs = 0
        kept: set[int] = set()

        def on_dir(dir_fd: int, rel: str) -> None:
            nonlocal complete, dirs, watching
            dirs += 1
            if not watching:
                return
            if dirs > MAX_WATCHED_DIRS:
                watching = False
                self._too_many = True
                hub.drop(self, set())
                kept.clear()
                return
            wd = hub.add(dir_fd, self, rel == "")
            if wd is None:
                complete = False
            else:
                kept.add(wd)

        found = walk_root(self.path, on_dir)
        if dirs == 0:
            complete = False  # no root to watch
        if self._too_many:
            hub.warn_once(f"dirs:{self.path}", "%s has more than %d directories to watch", self.path, MAX_WATCHED_DIRS)
            complete = False
            self._too_many = dirs > MAX_WATCHED_DIRS  # fewer again: the next listing watches
        else:
            hub.drop(self, kept)
        linked = next((rel for rel, st in found.items() if st.st_nlink > 1), None)
        if linked is not None:
            hub.warn_once(f"links:{self.path}", "%s/%s has more than one hard link", self.path, linked)
            complete = False
        self._trusted = complete and watching
        return {rel: signature(st) for rel, st in found.items()}
