"""Router: looks up a request's handler, applies policy, and executes it at most once through the ledger."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, overload

from farmhost.errors import FarmhostError
from farmhost.files import dump_json_text
from farmhost.handling import (
    ANY_ACTION,
    SITE_HANDLER,
    Approved,
    Change,
    Effect,
    Handlers,
    HandlerSpec,
    Preparer,
    Refusal,
    RequestContext,
    handler_key,
)
from farmhost.ipc.phases import ENVELOPE, HANDLER, LEDGER, RESULT, RequestPhases
from farmhost.protocol.codes import QUEUE_OF_TYPE, ErrorCode
from farmhost.protocol.envelope import Outcome, envelope, utc_stamp
from farmhost.store import ledger
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    import sqlite3

    from farmhost.layout import DataLayout
    from farmhost.ndjson_log import NdjsonLog
    from farmhost.protocol.codes import Queue
    from farmhost.protocol.requests import AnyRequest
    from farmhost.store.db import Database
    from farmhost.store.groups import Group

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The result document of a request and how it was reached."""

    document: dict[str, Any]
    effect: Effect
    replayed: bool = False  # the stored result of an earlier execution, nothing was run


def request_record(
    answer: Answer,
    group: Group,
    queue: Queue,
    source: tuple[str, str],
    request_id: str,
    *,
    received: datetime,
    started: float,
) -> dict[str, Any]:
    """The request log's line for an answered request; `source` is ("file", its name) or ("via", who in the host)."""
    doc = answer.document
    return {
        "ts": utc_stamp(received),
        "group": group.folder,
        "queue": queue.value,
        source[0]: source[1],
        "requestId": request_id,
        "type": doc["type"],
        "action": doc["action"],
        "status": doc["status"],
        "errorCode": doc["errorCode"],
        "durationMs": round((time.perf_counter() - started) * 1000, 3),
        "replayed": answer.replayed,
    }


def request_kind(doc: dict[str, Any]) -> str:
    """`type:action` of a result document (its type alone when it has no action), as the log lines name it."""
    return f"{doc['type']}:{doc['action']}" if doc["action"] else str(doc["type"])


class ResultSink(Protocol):
    """Where the result of a request answered from a file goes (`farmhost.ipc.results.FileAnswer`).

    It is prepared before the ledger row is written and named in that row's transaction: a read costs one.
    """

    async def prepare(self, document: dict[str, Any], data: bytes) -> bool:
        """Write the result (`document`, serialised as `data`) under a temp name (fsync'd); False when that failed."""
        ...

    def record(self, conn: sqlite3.Connection) -> None:
        """Name the prepared result in the ledger, inside the transaction that stores the request's result."""
        ...

    def committed(self) -> None:
        """That transaction committed: the result may be published."""
        ...

    @property
    def alone(self) -> bool:
        """No other request is being answered: its transaction need not wait a loop turn for others to share it."""
        ...


class Router:
    """Executes requests; the one place that talks to the ledger."""

    def __init__(
        self,
        *,
        handlers: Handlers,
        site: str,
        layout: DataLayout,
        db: Database,
        on_change: Callable[[set[Change]], None],
        request_log: NdjsonLog | None = None,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._handlers = handlers
        self._request_log = request_log
        self._site = site  # this farmhost's site: a request naming another one goes to the site row
        self._layout = layout
        self._db = db
        self._on_change = on_change
        self._clock = clock
        self._inflight: dict[tuple[str, str], asyncio.Future[Answer]] = {}

    def spec_for(self, request: AnyRequest) -> HandlerSpec | None:
        """The handler row of a request, if farmhost has one (a farm action for another site: the site row)."""
        site = request.__dict__.get("site")  # only a farm action has one (getattr of a missing field is slow)
        if site is not None and site != self._site:
            return self._handlers.get(SITE_HANDLER)
        return self._handlers.get(handler_key(request.type, request.action_name)) or self._handlers.get(request.type)

    def refused(self, key: tuple[str, str | None], refusal: Refusal) -> None:
        """Tell the row of `key` (type, action) of a request refused before it could be routed (not valid)."""
        kind, action = key
        spec = self._handlers.get(handler_key(kind, action)) or self._handlers.get(handler_key(kind, ANY_ACTION))
        if spec is not None:
            _tell(spec, refusal)

    def runs_elsewhere(self, request: AnyRequest) -> bool:
        """True for a request another site runs (its answer may take minutes)."""
        spec = self.spec_for(request)
        return spec is not None and spec.effect is Effect.REMOTE

    def reads_only(self, request: AnyRequest) -> bool:
        """True for a request whose handler changes nothing (answering it twice, or side by side, is harmless)."""
        spec = self.spec_for(request)
        return spec is not None and spec.effect is Effect.READ

    async def run_as(
        self,
        group: Group,
        request: AnyRequest,
        *,
        request_id: str,
        via: str,
        approved: Approved | None = None,
        received_at: datetime | None = None,
    ) -> Answer:
        """The host runs `request` as `group` itself: the one door for every request no agent wrote.

        The same way as an agent's request file: the ledger (one id runs once; a repeat gets the stored answer),
        the in-flight dedupe, the precheck and the handler's own policy and audit; and one line in the request log,
        with `via` where the file name would be.

        Args:
            group: the group it runs as (its policy, its ledger, its audit lines).
            request: the validated request.
            request_id: its id in the group's ledger; a host's own id has a `:`, which no agent's id may have
                (`approval:<id>`, `assist:<run>`), so no agent's request can take its place.
            via: who in the host asked (`approval`, `assist`, `site:<origin>`, `demo`), for the request log.
            approved: the approval in the chat it runs under (its approver goes into the audit line).
            received_at: when the host got it (the base of a `ttl`); now by default.
        """
        received = received_at or self._clock()
        started = time.perf_counter()
        queue = QUEUE_OF_TYPE[request.type]
        answer = await self.execute(
            group, queue, request, request_id, received_at=received, stale=False, approved=approved
        )
        doc = answer.document
        record = request_record(answer, group, queue, ("via", via), request_id, received=received, started=started)
        if self._request_log is not None:
            self._request_log.write(record)
        logger.info(
            "request %s (%s) run as group %s by the host (%s): %s%s%s",
            request_id,
            request_kind(doc),
            group.folder,
            via,
            doc["status"],
            f" ({doc['errorCode']})" if doc["errorCode"] else "",
            " (replayed)" if answer.replayed else "",
        )
        return answer

    async def execute(
        self,
        group: Group,
        queue: Queue,
        request: AnyRequest,
        request_id: str,
        *,
        received_at: datetime,
        stale: bool,
        approved: Approved | None = None,
        phases: RequestPhases | None = None,
        known: ledger.Lookup | None = None,
        sink: ResultSink | None = None,
    ) -> Answer:
        """Answer a request exactly once per (group, requestId).

        Args:
            group: the source group, known from the directory the file was found in.
            queue: the queue it came from.
            request: the validated request.
            request_id: its requestId (given, from the file name, or generated).
            received_at: when the host claimed it (the base of `ttl`).
            stale: the file was older than the stale limit at start-up: expire it instead of running it.
            approved: the approval in the chat it runs under (only the host's own `run_as` gives one).
            phases: where the time goes (the request file's own, which its log line carries).
            known: the ledger as the caller just read it (`ledger.lookup`, with no await since): not read again.
            sink: the request file's result. When nothing with effects ran (a read, a refusal), it is prepared
                before the ledger row and named in the same transaction; otherwise it is left alone and the
                caller writes the result after the row is stored.
        """
        phases = phases or RequestPhases()
        key = (group.folder, request_id)
        running = self._inflight.get(key)
        if running is not None:  # the same id in another queue of this group, still executing
            answer = _replay(await asyncio.shield(running))
            phases.lap(HANDLER)
            return answer
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            answer = await self._execute_once(
                group,
                queue,
                request,
                request_id,
                received_at=received_at,
                stale=stale,
                approved=approved,
                phases=phases,
                known=known,
                sink=sink,
            )
            future.set_result(answer)
            return answer
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved here so an unobserved failure is not logged twice
            raise
        finally:
            del self._inflight[key]

    async def _execute_once(
        self,
        group: Group,
        queue: Queue,
        request: AnyRequest,
        request_id: str,
        *,
        received_at: datetime,
        stale: bool,
        approved: Approved | None,
        phases: RequestPhases,
        known: ledger.Lookup | None,
        sink: ResultSink | None,
    ) -> Answer:
        if known is None:
            entry = ledger.get_entry(self._db.conn, group.folder, request_id)
            phases.lap(LEDGER)
        else:
            entry = known.entry
        spec = self.spec_for(request)
        effect = spec.effect if spec else Effect.READ
        if entry is not None and entry.state == "done" and entry.result is not None:
            return Answer(document=entry.result, effect=effect, replayed=True)
        started = time.perf_counter()
        ctx = RequestContext(
            group=group,
            layout=self._layout,
            db=self._db,
            now=self._clock(),
            request_id=request_id,
            approved=approved,
        )
        early: Outcome | None
        if entry is not None:  # started and never finished: the host died while it ran
            early = Outcome.failure(
                ErrorCode.INTERRUPTED,
                "the host stopped while this request was running; it was not repeated. Check the current state "
                "before trying again.",
            )
        else:
            early = self._precheck(group, request, spec, received_at=received_at, now=ctx.now, stale=stale)
            if early is not None and early.error_code is not None and spec is not None:
                refusal = Refusal(
                    group=group.folder,
                    request_id=request_id,
                    params=request.__dict__.get("params"),  # only some request types have params
                    code=early.error_code,
                    at=ctx.now,
                    duration_ms=round((time.perf_counter() - started) * 1000),
                    request=request,
                )
                _tell(spec, refusal)
        phases.lap(HANDLER)
        if early is not None or spec is None:
            outcome = early or _no_handler(request)
            return await self._finish(ctx, queue, request, outcome, effect, started, phases, sink=sink)
        if spec.effect is Effect.STATE:
            return await self._apply_state(ctx, queue, request, spec, started, phases)
        if spec.effect is Effect.EXTERNAL:
            with self._db.tx() as conn:
                ledger.mark_started(
                    conn,
                    folder=group.folder,
                    request_id=request_id,
                    queue=queue.value,
                    kind=request.type,
                    action=request.action_name,
                    at=ctx.now,
                )
            phases.lap(LEDGER)
        outcome = await self._run(ctx, request, spec)
        phases.lap(HANDLER)
        # A read may run again after a crash: its result file is prepared before its one transaction. A request
        # with outside effects stores its result first, so a crash before the file still replays that result.
        read_sink = sink if spec.effect is Effect.READ else None
        answer = await self._finish(ctx, queue, request, outcome, spec.effect, started, phases, sink=read_sink)
        if ctx.changes:  # committed in the handler's own transactions (an approval asked in the chat, ...)
            self._on_change(set(ctx.changes))
        return answer

    def _precheck(
        self,
        group: Group,
        request: AnyRequest,
        spec: HandlerSpec | None,
        *,
        received_at: datetime,
        now: datetime,
        stale: bool,
    ) -> Outcome | None:
        expires = request.expires_at(received_at)
        if stale or (expires is not None and expires <= now):
            why = "it waited too long before the host started" if stale else "its ttl/expiresAt passed"
            return Outcome.failure(ErrorCode.EXPIRED, f"request expired before it ran ({why}); nothing was done")
        if spec is not None and spec.main_only and not group.is_main:
            what = request.action_name or request.type
            return Outcome.failure(ErrorCode.UNAUTHORIZED, f"{what} is only allowed from the main group")
        return None

    async def _apply_state(
        self,
        ctx: RequestContext,
        queue: Queue,
        request: AnyRequest,
        spec: HandlerSpec,
        started: float,
        phases: RequestPhases,
    ) -> Answer:
        assert spec.apply is not None
        if spec.prepare is not None:
            prepared = await self._run(ctx, request, spec, spec.prepare)
            phases.lap(HANDLER)
            if isinstance(prepared, Outcome):
                return await self._finish(ctx, queue, request, prepared, spec.effect, started, phases)
            ctx = replace(ctx, prepared=prepared.value)
        try:
            with self._db.tx() as conn:
                outcome = spec.apply(ctx, request, conn)
                phases.lap(HANDLER)
                document = self._document(ctx, request, outcome, started)
                phases.lap(ENVELOPE)
                self._record(conn, ctx, queue, request, document)
            phases.lap(LEDGER)  # the record and the commit
        except FarmhostError as err:
            ctx.changes.clear()
            failure = Outcome.failure(err.code, err.message, err.result)
            return await self._finish(ctx, queue, request, failure, spec.effect, started, phases)
        except Exception:
            logger.exception("handler for %s failed in group %s", request.type, ctx.group.folder)
            ctx.changes.clear()
            return await self._finish(ctx, queue, request, _internal(), spec.effect, started, phases)
        if ctx.changes:
            self._on_change(set(ctx.changes))
        return Answer(document=document, effect=spec.effect)

    @overload
    async def _run(self, ctx: RequestContext, request: AnyRequest, spec: HandlerSpec) -> Outcome: ...

    @overload
    async def _run(
        self, ctx: RequestContext, request: AnyRequest, spec: HandlerSpec, step: Preparer
    ) -> Outcome | _Prepared: ...

    async def _run(
        self, ctx: RequestContext, request: AnyRequest, spec: HandlerSpec, step: Preparer | None = None
    ) -> Outcome | _Prepared:
        """Run the handler (or its `prepare` step) under its timeout; every failure becomes an Outcome."""
        try:
            if step is not None:
                return _Prepared(value=await _bounded(step(ctx, request), spec.timeout))
            assert spec.run is not None
            return await _bounded(spec.run(ctx, request), spec.timeout)
        except FarmhostError as err:
            return Outcome.failure(err.code, err.message, err.result)
        except TimeoutError:
            return Outcome.failure(ErrorCode.TIMEOUT, f"the host gave up after {spec.timeout:g} s")
        except Exception:
            logger.exception("handler for %s failed in group %s", request.type, ctx.group.folder)
            return _internal()

    async def _finish(
        self,
        ctx: RequestContext,
        queue: Queue,
        request: AnyRequest,
        outcome: Outcome,
        effect: Effect,
        started: float,
        phases: RequestPhases,
        *,
        sink: ResultSink | None = None,
    ) -> Answer:
        document = self._document(ctx, request, outcome, started)
        phases.lap(ENVELOPE)
        prepared = False
        text = None
        if sink is not None:
            text = dump_json_text(document)  # once, for the result file and the ledger
            prepared = await sink.prepare(document, text.encode())
            phases.lap(RESULT)

        def write(conn: sqlite3.Connection) -> None:
            self._record(conn, ctx, queue, request, document, text)
            if prepared:
                assert sink is not None
                sink.record(conn)

        on_commit = sink.committed if prepared and sink is not None else None
        if effect is Effect.READ:  # under load, several groups' reads share one commit
            alone = sink is not None and sink.alone
            await self._db.group_commit.write(write, on_commit=on_commit, alone=alone)
        else:
            with self._db.tx() as conn:
                write(conn)
            if on_commit is not None:
                on_commit()
        phases.lap(LEDGER)
        return Answer(document=document, effect=effect)

    def _document(self, ctx: RequestContext, request: AnyRequest, outcome: Outcome, started: float) -> dict[str, Any]:
        return envelope(
            request_id=ctx.request_id,
            kind=request.type,
            action=request.action_name,
            outcome=outcome,
            executed_at=ctx.now,
            duration_ms=round((time.perf_counter() - started) * 1000),
        )

    @staticmethod
    def _record(
        conn: Any,
        ctx: RequestContext,
        queue: Queue,
        request: AnyRequest,
        document: dict[str, Any],
        text: str | None = None,
    ) -> None:
        ledger.record_done(
            conn,
            folder=ctx.group.folder,
            request_id=ctx.request_id,
            queue=queue.value,
            kind=request.type,
            action=request.action_name,
            result=document,
            at=ctx.now,
            result_json=text,
        )


@dataclass(frozen=True)
class _Prepared:
    value: object


async def _bounded(work: Awaitable[_T], timeout: float) -> _T:
    """Await `work` under `timeout` (from now); a handler that finishes without waiting arms no timer.

    Most handlers (a ping, a warm memory search) never wait: their first step is their whole run, and the timer
    of `asyncio.timeout` (a heap entry armed and cancelled) was a noticeable part of such a request's cost.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    if not isinstance(work, Coroutine):  # another awaitable: waited for under the timer as it is
        async with asyncio.timeout_at(deadline):
            return await work
    try:
        pending = work.send(None)
    except StopIteration as done:
        return cast("_T", done.value)
    async with asyncio.timeout_at(deadline):
        return await _Resumed(work, pending)


class _Resumed(Generic[_T]):
    """The rest of a coroutine that already took its first step, awaited in the task that took it."""

    __slots__ = ("_pending", "_work")

    def __init__(self, work: Coroutine[Any, Any, _T], pending: Any) -> None:
        self._work = work
        self._pending = pending

    def __await__(self) -> Generator[Any, None, _T]:
        work, pending = self._work, self._pending
        while True:
            try:
                yield pending  # what the coroutine waits for, handed to the task as `await` would
            except GeneratorExit:
                work.close()
                raise
            except BaseException as err:  # noqa: BLE001 - thrown in by the task (a cancel): the coroutine's to handle
                try:
                    pending = work.throw(err)
                except StopIteration as done:
                    return cast("_T", done.value)
            else:
                try:
                    pending = work.send(None)
                except StopIteration as done:
                    return cast("_T", done.value)


def _replay(answer: Answer) -> Answer:
    return Answer(document=answer.document, effect=answer.effect, replayed=True)


def _internal() -> Outcome:
    return Outcome.failure(ErrorCode.INTERNAL, "the host failed while executing this request; see the host log")


def _no_handler(request: AnyRequest) -> Outcome:
    what = request.action_name or request.type
    return Outcome.failure(ErrorCode.UPSTREAM_UNAVAILABLE, f"{what} is not available on this host")


def _tell(spec: HandlerSpec, refusal: Refusal) -> None:
    """The row's own record of a refusal (the farm actions' audit line), written before the agent's answer."""
    if spec.on_refused is None:
        return
    try:
        spec.on_refused(refusal)
    except Exception:  # a record that fails must not keep the agent from its answer
        logger.exception("recording a refusal in group %s failed", refusal.group)
