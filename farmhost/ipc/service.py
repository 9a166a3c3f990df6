"""IpcService: keeps a GroupDir and queue workers per registered group, wakes them, writes snapshots.

Which groups it serves is the group registry's (`farmhost/groups/live.py`) to say: it attaches the registered groups
at start and then follows the registry's announcements (attach the added, detach the removed, serve the changed
with their new fields). It keeps no list of its own beyond what it attached.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from farmhost.background import every
from farmhost.config import IpcSettings
from farmhost.files import DIR_FLAGS
from farmhost.groups.live import GroupChange, GroupRegistry
from farmhost.handling import Change, Handlers
from farmhost.ipc import snapshots
from farmhost.ipc.admission import FairAdmission
from farmhost.ipc.churn_backoff import ChurnBackoff
from farmhost.ipc.groupdir import GroupDir
from farmhost.ipc.processor import RequestProcessor
from farmhost.ipc.quarantine import TRASH, Quarantine
from farmhost.ipc.results import prepared_for
from farmhost.ipc.router import Router
from farmhost.ipc.snapshot_writer import SnapshotWriter
from farmhost.ipc.sweeper import empty_trash, sweep_host_temp, sweep_quarantine, sweep_results
from farmhost.ipc.watcher import InotifyWatcher
from farmhost.ipc.worker import QueueWorker
from farmhost.layout import DataLayout
from farmhost.ndjson_log import NdjsonLog
from farmhost.protocol.codes import HOST_STATUS, Queue
from farmhost.store import ledger
from farmhost.store.db import Database, now_utc
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)

SWEEP_SECONDS = 3600.0
# A host temp file older than this was abandoned by a crash: no write takes a minute.
HOST_TEMP_GRACE_SECONDS = 60.0


@dataclass
class _Attached:
    group: Group
    gdir: GroupDir
    spool_fds: dict[Queue, int]
    workers: dict[Queue, QueueWorker] = field(default_factory=dict)
    watched: dict[Queue, tuple[int, int]] = field(default_factory=dict)  # (st_dev, st_ino) under each watch
    churn: ChurnBackoff = field(init=False)
    check: asyncio.Handle | None = None  # the pending check of its directories, if one is scheduled

    def __post_init__(self) -> None:
        self.churn = ChurnBackoff(self.group.folder)


class IpcService:
    """The IPC engine of one data directory."""

    def __init__(
        self,
        *,
        settings: IpcSettings,
        layout: DataLayout,
        db: Database,
        registry: GroupRegistry,
        handlers: Handlers,
        identity: snapshots.HostIdentity,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._layout = layout
        self._db = db
        self._identity = identity
        self._clock = clock
        self._request_log = NdjsonLog(layout.logs, max_bytes=settings.request_log_max_bytes)
        self.router = Router(
            handlers=handlers,
            site=settings.site,
            layout=layout,
            db=db,
            on_change=self._changed,
            request_log=self._request_log,
            clock=clock,
        )
        self._groups: dict[str, _Attached] = {}
        self._admission = FairAdmission()
        self._tasks: list[asyncio.Task[None]] = []
        self._unknown_dirs: set[str] = set()
        self._failing_snapshots: set[tuple[str, str]] = set()
        self._ipc_fd = self._errors_fd = self._spool_fd = -1
        self._watcher: InotifyWatcher | None = None
        self._processor: RequestProcessor | None = None
        self._quarantine: Quarantine | None = None  # one per daemon: it counts what each group's quarantine holds
        self._draining = False  # a task empties the quarantine's trash
        self._change_listeners: list[Callable[[set[Change]], None]] = []
        self._snapshots = SnapshotWriter(
            db=db,
            clock=clock,
            targets=lambda: [(a.group, a.gdir.fd) for a in self._groups.values()],
            fallback=self._write_named,
        )

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the directories, attach every registered group, write snapshots and start watching."""
        self._layout.create()
        self._ipc_fd = os.open(self._layout.ipc, DIR_FLAGS)
        self._errors_fd = os.open("errors", DIR_FLAGS, dir_fd=self._ipc_fd)
        self._quarantine = Quarantine(
            self._errors_fd,
            max_entries=self._settings.quarantine_max_files,
            max_bytes=self._settings.quarantine_max_mb * 2**20,
            on_trash=self._drain_trash,
        )
        self._spool_fd = os.open(".spool", DIR_FLAGS, dir_fd=self._ipc_fd)
        started = self._identity.started_at.timestamp()
        self._processor = RequestProcessor(
            router=self.router,
            db=self._db,
            quarantine=self._quarantine,
            request_log=self._request_log,
            max_request_bytes=self._settings.max_request_bytes,
            stale_before=started - self._settings.stale_request_seconds,
            clock=self._clock,
            settle=self._snapshots.settle,
        )
        if self._settings.mode == "inotify":
            self._watcher = InotifyWatcher(
                on_queue=self._queue_event,
                on_group=self._group_event,
                on_overflow=self._overflowed,
                group_entries=frozenset(queue.value for queue in Queue),
            )
            self._watcher.start()
        for group in self._registry.groups:
            self._attach(group)
        self._registry.subscribe(self._groups_changed)
        self.write_snapshots({Change.TASKS, Change.GROUPS})
        self._sweep()
        rescan = self._settings.rescan_seconds
        if self._settings.mode == "poll":
            rescan = min(rescan, self._settings.poll_seconds)
        self._spawn("ipc:rescan", every(rescan, self._rescan))
        self._spawn("ipc:heartbeat", every(self._settings.heartbeat_seconds, self._heartbeat))
        self._spawn("ipc:sweep", every(SWEEP_SECONDS, self._sweep))
        await self._snapshots.settle()  # agents find current snapshots as soon as the host is up
        await self._heartbeat()

    async def stop(self) -> None:
        """Stop every worker (the request in progress finishes or stays spooled) and say `stopped`."""
        self._registry.unsubscribe(self._groups_changed)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._snapshots.close()
        for folder in list(self._groups):
            await self._detach(self._groups.pop(folder), status="stopped")
        if self._watcher is not None:
            self._watcher.stop()
        for fd in (self._spool_fd, self._errors_fd, self._ipc_fd):
            if fd >= 0:
                os.close(fd)
        self._request_log.close()

    async def run_once(self) -> int:
        """Process everything pending in every group now (burst mode); returns how many requests ran."""
        counts = await asyncio.gather(*(w.drain() for a in self._groups.values() for w in a.workers.values()))
        return sum(counts)

    @property
    def groups(self) -> list[Group]:
        """The groups being served."""
        return [attached.group for attached in self._groups.values()]

    def wake_all(self) -> None:
        """Make every worker look at its queue (overflow, rescan, poll tick)."""
        for attached in self._groups.values():
            for worker in attached.workers.values():
                worker.wake()

    def add_change_listener(self, listener: Callable[[set[Change]], None]) -> None:
        """Call `listener(changes)` after each request that changed state (its snapshots are being rewritten)."""
        self._change_listeners.append(listener)

    # registry ----------------------------------------------------------------------------------

    def _groups_changed(self, change: GroupChange) -> None:
        """The registry announced a change: detach the removed groups, attach the added, serve the changed anew."""
        for group in change.removed:
            attached = self._groups.pop(group.folder, None)
            if attached is not None:
                self._spawn(f"ipc:detach:{group.folder}", self._detach(attached, status="stopped"))
        for group in change.changed:
            if group.folder in self._groups:
                self._groups[group.folder].group = group  # its workers read it from here at each request
        added = [group for group in change.added if group.folder not in self._groups]
        for group in added:
            self._attach(group)
        self.write_snapshots({Change.TASKS, Change.GROUPS})
        if added and self._tasks:
            # A group added while running says "alive" before its first request can be answered (its workers only
            # run once this returns to the loop), not at the next heartbeat: one small write per registration.
            document = snapshots.host_status(self._identity, status="alive", now=self._clock())
            for group in added:
                if (attached := self._groups.get(group.folder)) is not None:
                    self._write_snapshot(attached, HOST_STATUS, document)

    def _attach(self, group: Group) -> None:
        assert self._processor is not None
        try:
            self._layout.create_group(group.folder)
        except FileExistsError as err:
            # The agent replaced a queue or result directory with a file or a dangling link: GroupDir evicts
            # it to quarantine and recreates it below; it must never keep the daemon from starting.
            logger.warning("group %s: %s is not a directory; it will be quarantined", group.folder, err.filename)
        gdir = GroupDir(group.folder, self._ipc_fd, evict=self._evict)
        spool_fds = {queue: self._open_spool(group.folder, queue) for queue in Queue}
        attached = _Attached(group=group, gdir=gdir, spool_fds=spool_fds)
        for queue in Queue:
            worker = QueueWorker(
                group=lambda: attached.group,  # the attachment holds the group as last announced
                gdir=gdir,
                queue=queue,
                spool_fd=spool_fds[queue],
                processor=self._processor,
                admission=self._admission,
                events=self._watcher is not None,
            )
            attached.workers[queue] = worker
        self._groups[group.folder] = attached
        self._watch(attached)
        for worker in attached.workers.values():
            worker.start()
        logger.info("serving group %s (%s)%s", group.folder, group.jid, " [main]" if group.is_main else "")

    async def _detach(self, attached: _Attached, *, status: str) -> None:
        folder = attached.group.folder
        if attached.check is not None:
            attached.check.cancel()
        await asyncio.gather(*(w.stop() for w in attached.workers.values()))
        if self._watcher is not None and folder not in self._groups:
            for queue in (None, *Queue):
                self._watcher.unwatch(folder, queue.value if queue else None)
        self._write_snapshot(
            attached, HOST_STATUS, snapshots.host_status(self._identity, status=status, now=self._clock())
        )
        self._snapshots.forget(folder)
        attached.gdir.close()
        for fd in attached.spool_fds.values():
            os.close(fd)
        logger.info("stopped serving group %s", folder)

    def _open_spool(self, folder: str, queue: Queue) -> int:
        path = self._layout.spool / folder / queue.value
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(path, DIR_FLAGS)

    def _watch(self, attached: _Attached) -> None:
        if self._watcher is None:
            return
        self._watcher.watch(attached.group.folder, None, attached.gdir.fd)
        self._rewatch(attached)

    def _rewatch(self, attached: _Attached) -> None:
        """Watch each queue directory the group holds now, unless its watch is already on that directory.

        A worker may re-open a swapped queue directory before the group's directory event arrives, so the
        held directory itself, not whether `refresh` re-opened it, decides whether a new watch is needed.
        """
        if self._watcher is None:
            return
        for queue in Queue:
            with attached.gdir.lease(queue) as fd:
                info = os.fstat(fd)
                if attached.watched.get(queue) != (info.st_dev, info.st_ino):
                    self._watcher.watch(attached.group.folder, queue.value, fd)
                    attached.watched[queue] = (info.st_dev, info.st_ino)

    def _evict(self, dir_fd: int, name: str, seen: os.stat_result, reason: str) -> bool:
        folder = next((f for f, a in self._groups.items() if a.gdir.fd == dir_fd), "unknown")
        assert self._quarantine is not None
        return self._quarantine.evict(dir_fd, name, seen, folder=folder, queue=name, reason=reason, at=self._clock())

    # events and timers -------------------------------------------------------------------------

    def _queue_event(self, folder: str, queue: str) -> None:
        attached = self._groups.get(folder)
        if attached is None:
            return
        if attached.churn.throttled:
            self._group_event(folder)  # its workers are woken by the deferred check of its directories
        else:
            attached.workers[Queue(queue)].wake()

    def _group_event(self, folder: str) -> None:
        """Something happened to a group's directory: check it once, soon (later if the group keeps swapping)."""
        attached = self._groups.get(folder)
        if attached is None or attached.check is not None:
            return  # events of one read, and of a throttled group, share one check
        loop = asyncio.get_running_loop()
        delay = attached.churn.next_delay(loop.time(), attached.gdir.reopens)
        attached.check = (
            loop.call_later(delay, self._check_group, attached)
            if delay
            else loop.call_soon(self._check_group, attached)
        )

    def _check_group(self, attached: _Attached) -> None:
        attached.check = None
        if self._groups.get(attached.group.folder) is not attached:
            return  # detached meanwhile
        try:
            attached.gdir.refresh()
            self._rewatch(attached)
        except OSError as err:
            logger.error("group %s: cannot re-open its IPC directories: %s", attached.group.folder, err)
        for worker in attached.workers.values():
            worker.wake()

    def _overflowed(self) -> None:
        # Events were lost, directory swaps among them: re-verify every group's directories, then drain.
        for folder in list(self._groups):
            self._group_event(folder)

    def _rescan(self) -> None:
        for folder in list(self._groups):
            self._group_event(folder)
        for name in os.listdir(self._ipc_fd):
            known = name in self._groups or name in self._unknown_dirs or name == "errors" or name.startswith(".")
            if not known:
                logger.warning("ipc/%s is not a registered group folder; ignoring it", name)
                self._unknown_dirs.add(name)

    async def _heartbeat(self) -> None:
        document = snapshots.host_status(self._identity, status="alive", now=self._clock())
        # On the loop, not fsynced: a heartbeat is rewritten every few seconds and one lost in a power cut says nothing
        # wrong (the next start writes its own). A write is then ~0.1 ms, so a thread (and its hand-offs, ~10
        # wake-ups a write with the fsync) buys nothing; one group a turn, so a request that arrives meanwhile
        # waits for one write, not sixteen. Their temp files and renames are not what the group watchers look at.
        for attached in list(self._groups.values()):
            if self._groups.get(attached.group.folder) is attached:  # not detached meanwhile
                self._write_snapshot(attached, HOST_STATUS, document, durable=False)
            await asyncio.sleep(0)

    def _sweep(self) -> None:
        now, wall = self._clock(), time.time()
        results = temps = 0
        for attached in self._groups.values():
            results += sweep_results(
                attached.gdir.results_fd(), older_than=wall - self._settings.result_retention_hours * 3600
            )
            temps += sweep_host_temp(attached.gdir.fd, older_than=wall - HOST_TEMP_GRACE_SECONDS)
            results_fd = attached.gdir.results_fd()
            folder = attached.group.folder
            try:
                temps += sweep_host_temp(
                    results_fd,
                    older_than=wall - HOST_TEMP_GRACE_SECONDS,
                    pending=lambda name: ledger.is_prepared_result(self._db.conn, folder, name, prepared_for(name)),  # noqa: B023
                )
            finally:
                os.close(results_fd)
        quarantine = sweep_quarantine(
            self._errors_fd, older_than=wall - self._settings.quarantine_retention_days * 86400
        )
        if self._quarantine is not None:
            self._quarantine.recount()  # the sweep (or the operator) may have made room
        with self._db.tx(durable=False) as conn:
            pruned = ledger.prune(conn, older_than=now - timedelta(days=self._settings.ledger_retention_days))
        if results or temps or quarantine or pruned:
            logger.info(
                "swept %d uncollected results, %d abandoned temp files, %d old quarantined files, %d ledger entries",
                results,
                temps,
                quarantine,
                pruned,
            )

    def _changed(self, changes: set[Change]) -> None:
        if Change.GROUPS in changes:
            self._registry.reload()  # a request registered a group: attached (announced) before it is answered
        self.write_snapshots(changes)
        for listener in self._change_listeners:
            try:
                listener(set(changes))
            except Exception:
                logger.exception("change listener %r failed", listener)

    def write_snapshots(self, changes: set[Change]) -> None:
        """Rewrite, soon and off the loop, the snapshots `changes` affect, in the groups whose view changed."""
        self._snapshots.request(changes)

    async def refresh_snapshots(self, folder: str) -> None:
        """Rewrite one group's snapshots now (before its agent runs) and wait until they are written."""
        await self._snapshots.refresh(folder)

    def _write_named(self, folder: str, name: str, document: object) -> bool:
        attached = self._groups.get(folder)
        return attached is not None and self._write_snapshot(attached, name, document)

    def _write_snapshot(self, attached: _Attached, name: str, document: object, *, durable: bool = True) -> bool:
        key = (attached.group.folder, name)
        if snapshots.write_snapshot(attached.gdir.fd, name, document, evict=self._evict, durable=durable):
            if key in self._failing_snapshots:
                self._failing_snapshots.discard(key)
                logger.info("group %s: %s is written again", *key)
            return True
        if key not in self._failing_snapshots:  # log the failure once, not at every heartbeat
            self._failing_snapshots.add(key)
            logger.error("group %s: cannot write %s; agents will not see it until this is fixed", *key)
        return False

    def _drain_trash(self) -> None:
        """Empty the quarantine's trash in a thread, a budget at a time, until it is empty (one drain at once)."""
        if not self._draining:
            self._draining = True
            self._spawn("ipc:trash", self._drain())

    async def _drain(self) -> None:
        try:
            while True:
                # Its own descriptor: the thread may outlive a stop() that closes the daemon's.
                trash_fd = os.open(TRASH, DIR_FLAGS, dir_fd=self._errors_fd)
                if not await asyncio.to_thread(empty_trash, trash_fd):
                    return
        except OSError as err:
            logger.warning("cannot empty ipc/errors/%s/: %s; the next refused directory tries again", TRASH, err)
        finally:
            self._draining = False

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
