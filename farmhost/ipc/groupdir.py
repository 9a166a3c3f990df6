"""GroupDir: a group's IPC directory held by descriptors, so an agent cannot redirect the host with symlinks."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable

from farmhost.protocol.codes import RESULTS_DIR, Queue

logger = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Called with (dir_fd, entry name, reason) to move a bad entry out of the way before it is recreated.
Evict = Callable[[int, str, str], None]


class GroupDir:
    """Descriptors for `ipc/<folder>` and its queue and result directories.

    Every lookup goes through `openat(..., O_NOFOLLOW | O_DIRECTORY)` relative to the group's descriptor.
    A queue or result directory that an agent replaced with a symlink or a file is evicted (quarantined)
    and recreated empty, and the host keeps working on the real directory.
    """

    def __init__(self, folder: str, ipc_root_fd: int, *, evict: Evict) -> None:
        self.folder = folder
        self._evict = evict
        self.fd = os.open(folder, DIR_FLAGS, dir_fd=ipc_root_fd)
        self._queues: dict[str, int] = {}

    def close(self) -> None:
        """Close every descriptor."""
        for fd in self._queues.values():
            os.close(fd)
        self._queues.clear()
        os.close(self.fd)

    def queue_fd(self, queue: Queue) -> int:
        """The held descriptor of a queue directory (verified to still be the directory at that name)."""
        held = self._queues.get(queue.value)
        if held is not None and self._still_there(queue.value, held):
            return held
        if held is not None:
            os.close(held)
        fd = self._open_subdir(queue.value)
        self._queues[queue.value] = fd
        return fd

    def results_fd(self) -> int:
        """A fresh descriptor of `action_results/` (the caller closes it)."""
        return self._open_subdir(RESULTS_DIR)

    def refresh(self) -> list[Queue]:
        """Re-verify every queue directory; returns the queues whose directory had to be re-opened."""
        stale = [
            q for q in Queue if q.value not in self._queues or not self._still_there(q.value, self._queues[q.value])
        ]
        for queue in stale:
            self.queue_fd(queue)
        return stale

    def _still_there(self, name: str, fd: int) -> bool:
        try:
            current = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return stat.S_ISDIR(current.st_mode) and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino)

    def _open_subdir(self, name: str) -> int:
        for _ in range(3):
            try:
                return os.open(name, DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                self._mkdir(name)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                kind = self._entry_kind(name)
                logger.warning("group %s: %s/ was %s; moved it to quarantine and recreated it", self.folder, name, kind)
                self._evict(self.fd, name, f"{name}/ was replaced by {kind}; the host recreated the directory")
                self._mkdir(name)
        raise OSError(errno.EIO, f"cannot open {self.folder}/{name} as a directory")

    def _entry_kind(self, name: str) -> str:
        # Linux reports a symlink opened with O_DIRECTORY | O_NOFOLLOW as ENOTDIR, so look at the entry itself.
        try:
            mode = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return "something that vanished"
        if stat.S_ISLNK(mode):
            return "a symlink"
        return "a file" if stat.S_ISREG(mode) else "something that is not a directory"

    def _mkdir(self, name: str) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o775, dir_fd=self.fd)
