"""Discovery of new request files: inotify on held directory descriptors, or nothing in poll mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Final

from inotify_simple import INotify, parse_events
from inotify_simple import flags as f

from farmhost.ipc.reader import is_request_name

logger = logging.getLogger(__name__)

QUEUE_MASK = f.MOVED_TO | f.CLOSE_WRITE | f.DELETE_SELF | f.MOVE_SELF | f.ONLYDIR
# A group directory is watched for its queue directories being swapped (renamed, deleted, recreated). The names of
# those directories are the only entries whose events are passed on: the snapshots and heartbeats the host writes
# there (temp file, rename) would otherwise make every write re-check the group and wake its workers.
GROUP_MASK = f.CREATE | f.MOVED_TO | f.MOVED_FROM | f.DELETE | f.ONLYDIR

# One read takes up to this much of the event queue (one system call: no FIONREAD first); the loop calls `_read`
# again while more is queued.
_READ_BYTES: Final = 64 * 1024

QueueCallback = Callable[[str, str], None]
GroupCallback = Callable[[str], None]


class InotifyWatcher:
    """Wakes queue workers within milliseconds of a rename into a queue directory.

    Watches are added on `/proc/self/fd/<fd>` of the host's held descriptors, so the kernel watches the
    directory the host actually holds, never whatever an agent-controlled path points to now.
    """

    def __init__(
        self,
        *,
        on_queue: QueueCallback,
        on_group: GroupCallback,
        on_overflow: Callable[[], None],
        group_entries: frozenset[str],
    ) -> None:
        """`group_entries`: the names in a group directory whose creation, renaming or deletion calls `on_group`."""
        self._on_queue = on_queue
        self._group_entries = group_entries
        self._on_group = on_group
        self._on_overflow = on_overflow
        self._inotify: INotify | None = None
        self._targets: dict[int, tuple[str, str | None]] = {}
        self._by_target: dict[tuple[str, str | None], int] = {}

    def start(self) -> None:
        """Create the inotify instance and hook it into the running loop."""
        self._inotify = INotify(nonblocking=True)
        asyncio.get_running_loop().add_reader(self._inotify.fileno(), self._read)

    def stop(self) -> None:
        """Unhook and close."""
        if self._inotify is None:
            return
        asyncio.get_running_loop().remove_reader(self._inotify.fileno())
        self._inotify.close()
        self._inotify = None
        self._targets.clear()
        self._by_target.clear()

    def watch(self, folder: str, queue: str | None, dir_fd: int) -> None:
        """Watch a queue directory (queue set) or a group directory (queue None), replacing an older watch."""
        if self._inotify is None:
            return
        self.unwatch(folder, queue)
        mask = QUEUE_MASK if queue else GROUP_MASK
        wd = self._inotify.add_watch(f"/proc/self/fd/{dir_fd}", mask)
        self._targets[wd] = (folder, queue)
        self._by_target[(folder, queue)] = wd

    def unwatch(self, folder: str, queue: str | None) -> None:
        """Stop watching one directory."""
        wd = self._by_target.pop((folder, queue), None)
        if wd is None or self._inotify is None:
            return
        self._targets.pop(wd, None)
        with contextlib.suppress(OSError):  # the kernel already dropped it (directory deleted)
            self._inotify.rm_watch(wd)

    def _read(self) -> None:
        assert self._inotify is not None
        try:
            events = parse_events(os.read(self._inotify.fileno(), _READ_BYTES))
        except BlockingIOError:
            return
        for event in events:
            if event.mask & f.Q_OVERFLOW:
                logger.warning("inotify queue overflowed; rescanning every queue")
                self._on_overflow()
                continue
            target = self._targets.get(event.wd)
            if target is None:
                continue
            folder, queue = target
            if event.mask & f.IGNORED:
                self._targets.pop(event.wd, None)
                self._by_target.pop(target, None)
                self._on_group(folder)
            elif queue is None:
                if not event.name or event.name in self._group_entries:
                    self._on_group(folder)
            elif event.mask & (f.DELETE_SELF | f.MOVE_SELF):
                self._on_group(folder)
            elif not event.name or is_request_name(event.name):
                # A writer's temp file (`.x.tmp`, closed before its rename) is never picked up: waking the worker
                # for it only listed the queue once more before the rename's own event, on every request.
                self._on_queue(folder, queue)
