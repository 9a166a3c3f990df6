"""SnapshotWriter: keeps each group's `current_tasks.json` and `available_groups.json` current, off the loop.

Changes are coalesced (a burst of requests is one pass), each group's documents are computed on the loop (small
database reads) and compared with what was last written there, and only the documents that differ are written,
in a thread, with their fsyncs. The heartbeat (`host_status.json`) has its own timer in the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from farmhost.files import dump_json
from farmhost.handling import Change
from farmhost.ipc import snapshots
from farmhost.protocol.codes import AVAILABLE_GROUPS, CURRENT_TASKS
from farmhost.store.db import Database
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)

# (group, its held IPC directory descriptor) of every group being served, read at each pass.
Targets = Callable[[], Sequence[tuple[Group, int]]]
# Writes one snapshot on the loop, evicting what is in the way and logging a failure once; returns success.
WriteOnLoop = Callable[[str, str, object], bool]

_SNAPSHOTS = {Change.TASKS: CURRENT_TASKS, Change.GROUPS: AVAILABLE_GROUPS}


class SnapshotWriter:
    """Rewrites snapshots after changes, coalesced, only where a group's view changed."""

    def __init__(self, *, db: Database, clock: Callable[[], datetime], targets: Targets, fallback: WriteOnLoop) -> None:
        self._db = db
        self._clock = clock
        self._targets = targets
        self._fallback = fallback
        self._dirty: set[Change] = set()
        self._task: asyncio.Task[None] | None = None
        self._written: dict[tuple[str, str], bytes] = {}  # what each file holds, without its timestamps
        self._requested = self._done = 0  # generations: each request() asks for one, each pass covers all asked
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def request(self, changes: set[Change]) -> None:
        """Rewrite (soon, once for a burst) the snapshots that `changes` may have changed."""
        wanted = {c for c in changes if c in _SNAPSHOTS}
        if not wanted:
            return
        self._dirty |= wanted
        self._requested += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="ipc:snapshots")

    async def refresh(self, folder: str) -> None:
        """Write every snapshot of one group now, changed or not (before its agent runs), and wait for it."""
        targets = [(g, fd) for g, fd in self._targets() if g.folder == folder]
        await self._write(self._documents(targets, set(_SNAPSHOTS), force=True))

    def forget(self, folder: str) -> None:
        """A group is no longer served: if it comes back, its snapshots are written afresh."""
        for key in [k for k in self._written if k[0] == folder]:
            del self._written[key]

    async def settle(self) -> None:
        """Wait until the rewrites requested so far are written (not the ones other groups request meanwhile)."""
        if self._done >= self._requested or self._task is None or self._task.done():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._requested, waiter))
        await waiter

    async def close(self) -> None:
        """Finish the pass in progress (its thread owns duplicated descriptors) and stop."""
        if self._task is not None:
            self._dirty.clear()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _drain(self) -> None:
        try:
            while self._dirty:
                changes, self._dirty, covered = self._dirty, set(), self._requested
                try:
                    await self._write(self._documents(self._targets(), changes, force=False))
                except Exception:
                    logger.exception("writing snapshots failed; the next change or agent run rewrites them")
                self._done = covered
                self._wake(covered)
        finally:
            self._wake(self._requested)  # stopped (or cancelled): nobody waits for a pass that will not come

    def _wake(self, generation: int) -> None:
        still = []
        for wanted, waiter in self._waiters:
            if wanted <= generation:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((wanted, waiter))
        self._waiters = still

    def _documents(
        self, targets: Sequence[tuple[Group, int]], changes: set[Change], *, force: bool
    ) -> list[tuple[Group, int, str, object, bytes]]:
        registered = [g for g, _ in self._targets()]
        now = self._clock()
        due: list[tuple[Group, int, str, object, bytes]] = []
        tasks = snapshots.tasks_snapshots(self._db, [g for g, _ in targets]) if Change.TASKS in changes else {}
        for group, fd in targets:
            for change in sorted(changes):
                name = _SNAPSHOTS[change]
                document: Any
                if change is Change.TASKS:
                    document = tasks[group.folder]
                    view = dump_json(document)
                else:
                    document = snapshots.groups_snapshot(self._db, group, registered, now=now)
                    view = dump_json(document["groups"])  # lastSync alone is no change
                if force or self._written.get((group.folder, name)) != view:
                    due.append((group, fd, name, document, view))
        return due

    async def _write(self, due: list[tuple[Group, int, str, object, bytes]]) -> None:
        if not due:
            return
        # Duplicated descriptors stay valid in the thread even if a group is detached meanwhile.
        jobs = [(os.dup(fd), name, document) for _, fd, name, document, _ in due]
        written = await asyncio.to_thread(write_all_sync, jobs)
        for (group, _, name, document, view), ok in zip(due, written, strict=True):
            if not ok:
                ok = self._fallback(group.folder, name, document)  # evicts a planted directory, logs once
            if ok:
                self._written[(group.folder, name)] = view
            else:
                self._written.pop((group.folder, name), None)


def write_all_sync(jobs: Sequence[tuple[int, str, object]]) -> list[bool]:
    """Write snapshots into group directories, closing each descriptor; runs in a thread."""
    written = []
    for fd, name, document in jobs:
        try:
            written.append(snapshots.write_snapshot(fd, name, document, evict=no_evict))
        finally:
            os.close(fd)
    return written


def no_evict(dir_fd: int, name: str, seen: os.stat_result, reason: str) -> bool:
    """Eviction needs the event loop's state; the write fails here and the caller retries on the loop."""
    return False
