"""QueueWorker: drains one queue of one group in file-name order, spool leftovers first."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from farmhost.background import cancel_and_wait
from farmhost.ipc.admission import FairAdmission
from farmhost.ipc.groupdir import GroupDir, KeepsBeingReplaced
from farmhost.ipc.processor import ClaimedFile, Detach, Opened, RequestProcessor
from farmhost.ipc.reader import claim, pending_names
from farmhost.protocol.codes import Queue
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)

# A request that makes the host itself fail this many times is quarantined with an `internal` answer (or, if even
# that fails, left in the spool until the next start), so one poison file cannot stop every request behind it.
MAX_ATTEMPTS = 3
# Requests of a queue finishing in the background at once (farm actions waiting for another site); more are
# answered in line, which holds the queue up until one finishes.
MAX_DETACHED = 16
# Reads of one listing answered side by side at most (one admission turn, one thread hop for their fsyncs, one
# ledger transaction); a longer run of reads is answered in several rounds.
MAX_READS_TOGETHER = 16


class QueueWorker:
    """One task per (group, queue): requests of a queue run one after another, queues and groups in parallel."""

    def __init__(
        self,
        *,
        group: Callable[[], Group],
        gdir: GroupDir,
        queue: Queue,
        spool_fd: int,
        processor: RequestProcessor,
        admission: FairAdmission,
        events: bool = False,
    ) -> None:
        """Nothing runs before `start()`.

        Args:
            group: The group as currently registered (its name or trigger may change while it is served; its
                folder never does), read at each request.
            gdir: The group's held IPC directories.
            queue: The queue this worker drains.
            spool_fd: The host-private spool of this group's queue.
            processor: Processes one claimed file.
            admission: Shares the loop fairly between the groups.
            events: Every arrival in the queue wakes this worker (inotify): a drain woken by one stops after a
                listing's requests when nothing woke it meanwhile, instead of listing the queue once more.
        """
        self._group = group
        self.folder = group().folder
        self._admission = admission
        self.queue = queue
        self._gdir = gdir
        self._spool_fd = spool_fd
        self._processor = processor
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failures: dict[str, int] = {}
        self._first_pass = True  # spool leftovers and the first scan are what was there when serving started
        self._events = events
        # Something may be left in the spool to retry (a request that failed or could not be answered yet): only
        # then does a drain list the spool. Cleared just before a listing; whatever fails after it sets it again.
        self._spool_left = True
        self.spool_listings = 0  # how often the spool and the queue were listed (observable by tests)
        self.queue_listings = 0
        self._detached: dict[
            str, tuple[asyncio.Task[None], Coroutine[Any, Any, bool]]
        ] = {}  # spooled names finishing in the background

    def start(self) -> None:
        """Start draining; the first pass recovers the spool and scans the queue."""
        self._wake.set()
        self._task = asyncio.create_task(self._loop(), name=f"ipc:{self.folder}/{self.queue.value}")

    async def stop(self) -> None:
        """Stop after the request in progress (a cancelled request stays in the spool and is recovered)."""
        await cancel_and_wait(self._task)
        self._task = None
        for task, work in list(self._detached.values()):
            await cancel_and_wait(task)
            work.close()  # one cancelled before it started was never awaited

    def wake(self) -> None:
        """Something may have arrived."""
        self._wake.set()

    async def drain(self, *, woken: bool = False) -> int:
        """Process the spool leftovers, then everything in the queue until it is empty; returns the count.

        `woken`: called because an event woke the worker (`events`); the queue is listed again only when another
        one came meanwhile (every arrival sets it again), else the next event starts the next drain.
        """
        async with self._lock:
            try:
                return await self._drain(woken=woken)
            except BaseException:
                self._spool_left = True  # a request may have stayed in the spool
                raise

    async def _drain(self, *, woken: bool) -> int:
        done = 0
        at_start, self._first_pass = self._first_pass, False
        if self._spool_left or at_start:
            self._spool_left = False
            self.spool_listings += 1
            for name in pending_names(self._spool_fd):
                if self._parked(name) or name in self._detached:
                    continue
                if not await self._process(name, at_start=at_start):
                    self._spool_left = True
                    return done  # results cannot be written now; the next rescan retries
                done += 1
        while True:
            picked = time.perf_counter_ns()  # a request's claim phase starts with the listing that finds it
            # One lease per batch: names are listed and claimed from the same directory, which stays open even
            # if the agent swaps it meanwhile. A parked name stays in the queue too: claiming it would replace
            # the parked file in the spool.
            with self._gdir.lease(self.queue) as queue_fd:
                self.queue_listings += 1
                names = [n for n in pending_names(queue_fd) if not self._parked(n) and n not in self._detached]
                if not names:
                    return done
                done_here, ok = await self._serve(queue_fd, names, at_start=at_start, picked=picked)
                done += done_here
                if not ok:
                    self._spool_left = True
                    return done
            await asyncio.sleep(0)
            if woken and self._events:
                if not self._wake.is_set():
                    return done  # nothing arrived since the listing: the next arrival's event wakes the worker
                self._wake.clear()  # the listing below sees what that event announced
            at_start = False  # what a later listing finds arrived while the host was running

    async def _serve(self, queue_fd: int, names: list[str], *, at_start: bool, picked: int) -> tuple[int, bool]:
        """Claim and answer the names of one listing; how many were answered, and False to stop the drain there.

        Reads found together are answered side by side (`_answer_reads`): their fsyncs share a thread hop and
        their ledger rows a transaction. Anything else is answered alone, after the reads listed before it, so
        what changes state keeps its place in file-name order.
        """
        done = 0
        reads: list[Opened] = []
        for name in names:
            try:
                claimed = claim(queue_fd, name, self._spool_fd)
            except OSError as err:
                logger.error("group %s: cannot claim %s/%s: %s", self.folder, self.queue, name, err)
                return done + (await self._answer_reads(reads))[0], False
            if not claimed:
                continue
            opened = await self._open(name, at_start=at_start, picked_ns=picked)
            if opened is False:
                return done + (await self._answer_reads(reads))[0], False
            if opened is True:
                done += 1
            elif self._processor.reads_only(opened) and len(reads) < MAX_READS_TOGETHER - 1:
                reads.append(opened)
                picked = time.perf_counter_ns()
                continue
            elif self._processor.reads_only(opened):
                reads.append(opened)
                answered, ok = await self._answer_reads(reads)
                done += answered
                if not ok:
                    return done, False
            else:
                answered, ok = await self._answer_reads(reads)
                done += answered
                if not ok or not await self._finish(opened):
                    return done, False
                done += 1
            await asyncio.sleep(0)  # let other groups' workers run between requests
            picked = time.perf_counter_ns()
        answered, ok = await self._answer_reads(reads)
        return done + answered, ok

    async def _open(self, name: str, *, at_start: bool, picked_ns: int) -> Opened | bool:
        """Read and validate a claimed request; a bool when that was all (as `_process`: False to retry later)."""
        try:
            opened = await self._processor.open(self._item(name, at_start=at_start, picked_ns=picked_ns))
        except Exception:  # noqa: BLE001 - logged with its traceback by _host_failed
            return await self._host_failed(name)
        if opened is None:
            self._failures.pop(name, None)
            return True
        return opened

    async def _finish(self, opened: Opened, *, take_turn: bool = True) -> bool:
        """Answer an opened request (in the group's admission turn unless the caller holds one); as `_process`."""
        name = opened.item.name
        try:
            if opened.item.group.is_main:
                answered = await self._processor.finish(opened, detach=self._detacher(name))
            elif take_turn:
                async with self._admission.turn(self.folder):
                    answered = await self._processor.finish(opened)
            else:
                answered = await self._processor.finish(opened)
        except Exception:  # noqa: BLE001 - logged with its traceback by _host_failed
            return await self._host_failed(name)
        self._failures.pop(name, None)
        return answered

    async def _answer_reads(self, reads: list[Opened]) -> tuple[int, bool]:
        """Answer the reads listed together side by side, in one admission turn; empties `reads`.

        Returns how many were answered, and False when one must stay in the spool (the queue stops there).
        """
        batch = list(reads)
        reads.clear()
        if len(batch) <= 1:
            ok = not batch or await self._finish(batch[0])
            return len(batch) if ok else 0, ok
        if batch[0].item.group.is_main:
            answered = await asyncio.gather(*(self._finish(opened) for opened in batch))
        else:
            async with self._admission.turn(self.folder):
                answered = await asyncio.gather(*(self._finish(opened, take_turn=False) for opened in batch))
        return sum(answered), all(answered)

    def _parked(self, name: str) -> bool:
        return self._failures.get(name, 0) >= MAX_ATTEMPTS

    def _detacher(self, name: str) -> Detach | None:
        if len(self._detached) >= MAX_DETACHED:
            return None

        def detach(work: Coroutine[Any, Any, bool]) -> None:
            task = asyncio.create_task(self._in_background(name, work), name=f"ipc:{self.folder}/{name}")
            self._detached[name] = (task, work)

        return detach

    async def _in_background(self, name: str, work: Coroutine[Any, Any, bool]) -> None:
        retry_now = True
        try:
            if not await work:
                retry_now = False  # results cannot be written now; the next rescan retries
                self._spool_left = True
            else:
                self._failures.pop(name, None)
        except Exception:  # noqa: BLE001 - logged with its traceback by _host_failed
            retry_now = False
            self._spool_left = True
            await self._host_failed(name)
        finally:
            self._detached.pop(name, None)
        if retry_now:
            self._wake.set()  # a file of the same name may wait in the queue for this one

    async def _process(self, name: str, *, at_start: bool, picked_ns: int = 0) -> bool:
        """Process one spooled request; a failure of the host itself is retried, then the request is parked."""
        item = self._item(name, at_start=at_start, picked_ns=picked_ns)
        try:
            if item.group.is_main:
                # The operator's own group never waits for a turn, and only it sends farm actions to other sites
                # (which finish in the background).
                answered = await self._processor.process(item, detach=self._detacher(name))
            else:
                async with self._admission.turn(self.folder):
                    answered = await self._processor.process(item)
        except Exception:  # noqa: BLE001 - logged with its traceback by _host_failed
            return await self._host_failed(name)
        self._failures.pop(name, None)
        return answered

    async def _host_failed(self, name: str) -> bool:
        """Count a failure of the host on `name`; at MAX_ATTEMPTS quarantine it. False: retry at the next rescan."""
        attempts = self._failures[name] = self._failures.get(name, 0) + 1
        where = f"group {self.folder}: {self.queue}/{name}"
        if attempts < MAX_ATTEMPTS:
            logger.exception("%s failed inside the host (attempt %d); retrying at the next rescan", where, attempts)
            return False
        logger.exception("%s failed inside the host %d times; quarantining it", where, attempts)
        try:
            await self._processor.give_up(self._item(name), attempts)
        except Exception:
            logger.exception("%s could not be quarantined; left in the spool until the next start", where)
            return True
        self._failures.pop(name, None)
        return True

    def _item(self, name: str, *, at_start: bool = False, picked_ns: int = 0) -> ClaimedFile:
        return ClaimedFile(
            group=self._group(),
            gdir=self._gdir,
            queue=self.queue,
            spool_fd=self._spool_fd,
            name=name,
            at_start=at_start,
            picked_ns=picked_ns,
        )

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.drain(woken=True)
            except asyncio.CancelledError:
                raise
            except KeepsBeingReplaced as err:  # the agent's doing: one line, no traceback (its group's check retries)
                logger.error("group %s: queue %s: %s; retrying at the next rescan", self.folder, self.queue, err)
            except Exception:
                # A bug must not stop a queue for good; the request stays in the spool and is retried.
                logger.exception("group %s: queue %s failed; retrying at the next rescan", self.folder, self.queue)
