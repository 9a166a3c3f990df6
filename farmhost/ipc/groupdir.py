"""GroupDir: a group's IPC directory held by descriptors, so an agent cannot redirect the host with symlinks."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from farmhost.files import DIR_FLAGS
from farmhost.protocol.codes import RESULTS_DIR, Queue

logger = logging.getLogger(__name__)


# Called with (dir_fd, entry name, what the host saw there, reason) to move a bad entry out of the way before
# the directory is recreated; moves it only if it is still what was seen, and returns whether it did.
Evict = Callable[[int, str, os.stat_result, str], bool]

# An agent swapping the entry in a tight loop gets this many tries per open; the next call tries again.
_OPEN_ATTEMPTS = 4


class KeepsBeingReplaced(OSError):
    """A directory an agent replaced again at every attempt to open it (a swap storm): not a fault of the host."""


@dataclass(eq=False)
class _Held:
    """One held queue-directory descriptor; closed only when retired and no lease uses it any more."""

    fd: int
    ident: tuple[int, int]
    users: int = 0
    retired: bool = False

    def release(self) -> None:
        if self.retired and self.users == 0 and self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class GroupDir:
    """Descriptors for `ipc/<folder>` and its queue and result directories.

    Every lookup goes through `openat(..., O_NOFOLLOW | O_DIRECTORY)` relative to the group's descriptor.
    A queue or result directory that an agent replaced with a symlink or a file is evicted (quarantined)
    and recreated empty, and the host keeps working on the real directory.

    Queue descriptors are leased: a replacement is opened before the old descriptor is retired, and a retired
    descriptor is closed only when its last lease ends, so a descriptor number in use can never be closed and
    handed by the kernel to another group's directory.
    """

    def __init__(self, folder: str, ipc_root_fd: int, *, evict: Evict) -> None:
        self.folder = folder
        self._evict = evict
        self.fd = os.open(folder, DIR_FLAGS, dir_fd=ipc_root_fd)
        self._queues: dict[str, _Held] = {}
        self.reopens = 0  # queue directories found replaced and opened anew, since the group was attached

    def close(self) -> None:
        """Close every descriptor (a leased one when its lease ends)."""
        for held in self._queues.values():
            held.retired = True
            held.release()
        self._queues.clear()
        os.close(self.fd)

    @contextlib.contextmanager
    def lease(self, queue: Queue) -> Iterator[int]:
        """The descriptor of a queue directory, verified to still be the directory at that name.

        It stays open until the block ends, even if the directory is replaced meanwhile.
        """
        held = self._current(queue.value)
        held.users += 1
        try:
            yield held.fd
        finally:
            held.users -= 1
            held.release()

    def results_fd(self) -> int:
        """A fresh descriptor of `action_results/` (the caller closes it)."""
        return self._open_subdir(RESULTS_DIR)

    def refresh(self) -> list[Queue]:
        """Re-verify every queue directory; returns the queues whose directory had to be re-opened."""
        stale = [
            q for q in Queue if q.value not in self._queues or not self._still_there(q.value, self._queues[q.value])
        ]
        for queue in stale:
            self._current(queue.value)
        return stale

    def _current(self, name: str) -> _Held:
        held = self._queues.get(name)
        if held is not None and self._still_there(name, held):
            return held
        fd = self._open_subdir(name)  # may raise: the old descriptor then stays held, open and valid
        info = os.fstat(fd)
        fresh = _Held(fd=fd, ident=(info.st_dev, info.st_ino))
        self._queues[name] = fresh
        if held is not None:
            self.reopens += 1
            held.retired = True
            held.release()
        return fresh

    def _still_there(self, name: str, held: _Held) -> bool:
        try:
            current = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISDIR(current.st_mode) and (current.st_dev, current.st_ino) == held.ident

    def _open_subdir(self, name: str) -> int:
        for _ in range(_OPEN_ATTEMPTS):
            try:
                return os.open(name, DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                self._mkdir(name)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                self._evict_non_directory(name)
        raise KeepsBeingReplaced(
            errno.EIO, f"cannot open {self.folder}/{name} as a directory (it keeps being replaced)"
        )

    def _evict_non_directory(self, name: str) -> None:
        # Linux reports a symlink opened with O_DIRECTORY | O_NOFOLLOW as ENOTDIR, so look at the entry itself.
        try:
            seen = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # gone already: the next attempt recreates the directory
        if stat.S_ISDIR(seen.st_mode):
            return  # the real directory is back: the next attempt opens it
        kind = _kind(seen.st_mode)
        reason = f"{name}/ was replaced by {kind}; the host recreated the directory"
        if self._evict(self.fd, name, seen, reason):
            logger.warning("group %s: %s/ was %s; moved it to quarantine and recreated it", self.folder, name, kind)
            self._mkdir(name)

    def _mkdir(self, name: str) -> None:
        try:
            os.mkdir(name, 0o775, dir_fd=self.fd)
        except FileExistsError:
            return
        owner = os.fstat(self.fd)
        if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
            # The group's directory was handed to its agent's uid: so is what the host recreates in it.
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, owner.st_uid, owner.st_gid, dir_fd=self.fd, follow_symlinks=False)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a file" if stat.S_ISREG(mode) else "something that is not a directory"
