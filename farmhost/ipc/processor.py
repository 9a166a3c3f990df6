"""One claimed request file, start to finish: read, validate, route, answer, log, release."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from farmhost.handling import Effect, Refusal
from farmhost.ipc.groupdir import GroupDir
from farmhost.ipc.phases import CLAIM, DECODE, LEDGER, LOG, READ, RESULT, SETTLE, RequestPhases
from farmhost.ipc.quarantine import Quarantine
from farmhost.ipc.reader import Refused, read_claimed
from farmhost.ipc.results import ResultWriter, key_of
from farmhost.ipc.router import Router, request_kind, request_record
from farmhost.ndjson_log import NdjsonLog
from farmhost.protocol.codes import REQUEST_ID_RE, ErrorCode, Queue
from farmhost.protocol.decode import RequestRejected, decode_request
from farmhost.protocol.envelope import Outcome, envelope, utc_stamp
from farmhost.store import ledger
from farmhost.store.db import Database
from farmhost.store.groups import Group

if TYPE_CHECKING:
    from farmhost.protocol.requests import AnyRequest

logger = logging.getLogger(__name__)
# Takes over the rest of a request's processing (a coroutine that answers it and returns `process`'s bool).
Detach = Callable[[Coroutine[Any, Any, bool]], None]
# Request files up to this size are read and parsed on the loop (well under a millisecond); larger ones in a thread.
_INLINE_BYTES = 16 * 1024
# The request log's fields that also go on the daemon's log line (as `extra`: JSON logs carry them).
_LOGGED = ("group", "queue", "requestId", "type", "action", "status", "errorCode", "durationMs")


@dataclass(frozen=True, kw_only=True)
class ClaimedFile:
    """A request file now in the host's spool."""

    group: Group
    gdir: GroupDir
    queue: Queue
    spool_fd: int
    name: str
    at_start: bool = False  # found when the host started serving the group: only such files can be stale
    picked_ns: int = 0  # time.perf_counter_ns() when the worker began the listing that claimed it; 0: in the spool


@dataclass(frozen=True, kw_only=True)
class Opened:
    """A claimed request read and validated, ready to be answered (`RequestProcessor.finish`)."""

    item: ClaimedFile
    request: AnyRequest
    request_id: str
    received: datetime
    started: float
    stale: bool
    phases: RequestPhases
    key: str  # `file_key` of the claimed file, from the descriptor it was read through


class RequestProcessor:
    """Turns claimed files into results; never raises for anything an agent can write."""

    def __init__(
        self,
        *,
        router: Router,
        db: Database,
        quarantine: Quarantine,
        request_log: NdjsonLog,
        max_request_bytes: int,
        stale_before: float,
        clock: Callable[[], datetime],
        settle: Callable[[], Awaitable[None]],
    ) -> None:
        self._router = router
        self._settle = settle
        self._db = db
        self._quarantine = quarantine
        self._log = request_log
        self._max_bytes = max_request_bytes
        self._stale_before = stale_before
        self._clock = clock
        self._results = ResultWriter(db=db, quarantine=quarantine, clock=clock)

    async def process(self, item: ClaimedFile, *, detach: Detach | None = None) -> bool:
        """Answer one claimed request; returns False when it must stay in the spool to be retried.

        A main group's farm action for another site waits for that site (up to minutes): given `detach`, it is
        handed over to finish in the background and this returns at once, so the queue goes on meanwhile.
        """
        opened = await self.open(item)
        if opened is None:
            return True
        return await self.finish(opened, detach=detach)

    async def open(self, item: ClaimedFile) -> Opened | None:
        """Read and validate a claimed request; None when it is answered already (refused) or gone."""
        started = time.perf_counter()
        phases = RequestPhases(item.picked_ns or None)
        if item.picked_ns:
            phases.lap(CLAIM)
        received = self._clock()
        stem = item.name[: -len(".json")]
        try:
            # Reading and parsing up to a MiB takes milliseconds (far more on an SD card): a large file is handled
            # in a thread, so no group's queue waits for it; small ones (nearly all) skip the thread hop.
            seen = os.stat(item.name, dir_fd=item.spool_fd, follow_symlinks=False)
            large = seen.st_size > _INLINE_BYTES
            if large:
                raw, info = await asyncio.to_thread(
                    read_claimed, item.spool_fd, item.name, max_bytes=self._max_bytes, seen=seen
                )
            else:
                raw, info = read_claimed(item.spool_fd, item.name, max_bytes=self._max_bytes, seen=seen)
        except FileNotFoundError:
            return None
        except Refused as refused:
            # Unread, but the agent's client names the file `<requestId>.json`: answer it under that id.
            stem_id = stem if REQUEST_ID_RE.fullmatch(stem) else None
            await self._refuse(item, refused.reason, refused.code, stem_id, None, received, started)
            return None
        phases.lap(READ)
        try:
            if large:
                request = await asyncio.to_thread(decode_request, item.queue, raw, stem=stem)
            else:
                request = decode_request(item.queue, raw, stem=stem)
        except RequestRejected as rejected:
            await self._refuse(
                item,
                rejected.reason,
                ErrorCode.INVALID_REQUEST,
                rejected.request_id,
                rejected.kind,
                received,
                started,
                rejected=rejected,
            )
            return None
        phases.lap(DECODE)
        key = key_of(item, info)
        return Opened(
            item=item,
            request=request,
            request_id=request.requestId or _generated_id(key),
            received=received,
            started=started,
            stale=item.at_start and info.st_mtime < self._stale_before,
            phases=phases,
            key=key,
        )

    def reads_only(self, opened: Opened) -> bool:
        """True when answering the request changes nothing (a read): several may be answered side by side."""
        try:
            return self._router.reads_only(opened.request)
        except Exception:  # noqa: BLE001 - a host bug: answering the request alone meets it again and counts it
            return False

    async def finish(self, opened: Opened, *, detach: Detach | None = None) -> bool:
        """Answer an opened request (`process`'s second half); False when it must stay in the spool."""
        item = opened.item
        elsewhere = detach is not None and item.group.is_main and self._router.runs_elsewhere(opened.request)
        work = self._finish(
            item,
            opened.request,
            opened.request_id,
            received=opened.received,
            started=opened.started,
            stale=opened.stale,
            phases=opened.phases,
            key=opened.key,
        )
        if elsewhere:
            assert detach is not None
            detach(work)
            return True
        return await work

    async def _finish(
        self,
        item: ClaimedFile,
        request: AnyRequest,
        request_id: str,
        *,
        received: datetime,
        started: float,
        stale: bool,
        phases: RequestPhases,
        key: str,
    ) -> bool:
        # The ledger is read once (the id's entry and this file's prepared result) and, for a read, written once:
        # the result file is prepared before that transaction and named in it (results.FileAnswer).
        with self._results.answering():
            known = ledger.lookup(self._db.conn, item.group.folder, request_id, key)
            phases.lap(LEDGER)
            sink = None if known.answering is not None else self._results.answer_for(item, key, request_id)
            try:
                answer = await self._router.execute(
                    item.group,
                    item.queue,
                    request,
                    request_id,
                    received_at=received,
                    stale=stale,
                    phases=phases,
                    known=known,
                    sink=sink,
                )
                if answer.effect is Effect.STATE:
                    await self._settle()  # an agent that reads a snapshot after its result sees the change in it
                    phases.lap(SETTLE)
                fsync_dir = answer.effect is not Effect.READ
                if sink is not None and sink.failed:
                    return False  # the result could not be written; its ledger row replays it at the retry
                if sink is not None and sink.recorded:
                    published = await sink.publish(fsync_dir=fsync_dir)
                else:
                    published = await self._results.publish(
                        item,
                        request_id,
                        answer.document,
                        fsync_dir=fsync_dir,
                        phases=phases,
                        key=key,
                        looked_up=(known.answering,),
                    )
            finally:
                if sink is not None:
                    sink.close()
            if not published:
                return False
            os.unlink(item.name, dir_fd=item.spool_fd)
            phases.lap(RESULT)
            doc = answer.document
            source = ("file", item.name)
            record = request_record(
                answer, item.group, item.queue, source, request_id, received=received, started=started
            )
            logger.info(
                "request %s (%s) from group %s: %s%s in %.1f ms%s",
                request_id,
                request_kind(doc),
                item.group.folder,
                doc["status"],
                f" ({doc['errorCode']})" if doc["errorCode"] else "",
                record["durationMs"],
                " (replayed)" if answer.replayed else "",
                extra={k: record[k] for k in _LOGGED},
            )
            # The request log's line is written last, to carry every phase up to its own write.
            phases.lap(LOG)
            record["phasesUs"] = phases.as_us()
            self._log.write(record)
            return True

    async def _answer(
        self,
        item: ClaimedFile,
        request_id: str,
        document: dict[str, object],
        *,
        fsync_dir: bool,
        phases: RequestPhases | None = None,
    ) -> bool:
        return await self._results.publish(item, request_id, document, fsync_dir=fsync_dir, phases=phases)

    async def give_up(self, item: ClaimedFile, attempts: int) -> None:
        """Quarantine a request the host itself failed on `attempts` times, answering `internal` under its stem."""
        stem = item.name[: -len(".json")]
        await self._refuse(
            item,
            f"the host failed {attempts} times while handling this request (a host bug; see the host log)",
            ErrorCode.INTERNAL,
            stem if REQUEST_ID_RE.fullmatch(stem) else None,
            None,
            self._clock(),
            time.perf_counter(),
        )

    async def _refuse(
        self,
        item: ClaimedFile,
        reason: str,
        code: ErrorCode,
        request_id: str | None,
        kind: str | None,
        received: datetime,
        started: float,
        *,
        rejected: RequestRejected | None = None,
    ) -> None:
        """Answer a request that cannot run (unless its id was answered already) and quarantine its file.

        A request of a known type told apart by `rejected` is told to its handler's row too (a farm action's
        audit line), before the answer.
        """
        answered = False
        # Answer before moving the file out of the spool: a crash in between re-runs this refusal (same answer)
        # instead of leaving the agent without one.
        # An id already answered keeps its stored result (SPEC: the same id gets the earlier answer back); a bad
        # file must not overwrite it, but the agent, who may have collected it already, gets it again.
        entry = ledger.get_entry(self._db.conn, item.group.folder, request_id) if request_id else None
        if entry is None and rejected is not None and rejected.kind is not None:
            refusal = Refusal(
                group=item.group.folder,
                request_id=request_id,
                params=rejected.params,
                action=rejected.named,
                code=code,
                at=received,
                duration_ms=round((time.perf_counter() - started) * 1000),
            )
            self._router.refused((rejected.kind, rejected.action), refusal)
        if request_id and entry is None:
            document = envelope(
                request_id=request_id,
                kind=kind or "unknown",
                action=rejected.action if rejected is not None and kind is not None else None,
                outcome=Outcome.failure(code, f"request refused: {reason}"),
                executed_at=received,
                duration_ms=round((time.perf_counter() - started) * 1000),
            )
            answered = await self._answer(item, request_id, document, fsync_dir=False)
        elif request_id and entry is not None and entry.result is not None:
            answered = await self._answer(item, request_id, entry.result, fsync_dir=False)
        self._quarantine.move(
            item.spool_fd,
            item.name,
            folder=item.group.folder,
            queue=item.queue.value,
            original_name=item.name,
            reason=reason,
            code=code,
            at=received,
            request_id=request_id,
        )
        self._log.write(
            {
                "ts": utc_stamp(received),
                "group": item.group.folder,
                "queue": item.queue.value,
                "file": item.name,
                "requestId": request_id,
                "type": kind,
                "status": "quarantined",
                "errorCode": code.value,
                "reason": reason,
                "answered": answered,
                "durationMs": round((time.perf_counter() - started) * 1000, 3),
            }
        )


def _generated_id(key: str) -> str:
    """An id for a request that has none, derived from the claimed file so a restart after a crash finds it again.

    A random id would make the ledger miss the earlier execution and run a STATE request twice. The inode and
    mtime survive the claim's rename and differ between two files written one after the other.
    """
    return f"gen-{hashlib.sha256(key.encode()).hexdigest()[:24]}"
