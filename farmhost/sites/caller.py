"""The origin's side of a farm action for another site: send it, keep it until answered, bring the answer home.

A main group's `farm_action` with `site` naming another farmhost is stored in `site_calls` (durable) before it
is first sent, then sent again after every reconnect, when the target comes back online and every
`FARMHOST_SITE_RESEND_SECONDS` (10) until its answer arrives: at least once on the wire, and the target's ledger
runs each id once. The answer becomes the request's own result (its error code and message, prefixed with the
site). A call nobody can answer gets a definite one at its deadline: `not_found` for a site the broker does not know,
`upstream_unavailable` while the broker or the site is away, `timeout` when the site is there and silent.
After a crash the request is recovered from the spool, finds its row and waits for the same answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from farmhost.background import cancel_and_wait, every
from farmhost.farm.actions import refusal_auditor
from farmhost.handling import SITE_HANDLER, Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.codes import SITE_DEADLINE_SECONDS, ErrorCode
from farmhost.protocol.envelope import Outcome, utc_stamp
from farmhost.protocol.requests import AnyRequest, FarmActionRequest
from farmhost.sites import wire
from farmhost.sites.directory import SiteDirectory
from farmhost.store import site_calls
from farmhost.store.db import now_utc
from farmhost.store.site_calls import SiteCall

if TYPE_CHECKING:
    from farmhost.config import SiteSettings
    from farmhost.farm.audit import AuditLog
    from farmhost.mqtt.link import Incoming, MqttLink
    from farmhost.store.db import Database

logger = logging.getLogger(__name__)

# After (re)connecting, retained availability topics arrive at once; a site not heard of by then is unknown.
DIRECTORY_SETTLE_SECONDS: Final = 1.5
# Request fields that stay at the origin: the target gets its own deadline and no site.
_LOCAL_FIELDS: Final = frozenset({"site", "ttl", "expiresAt", "timestamp", "groupFolder"})


class SiteCaller:
    """Sends this site's farm actions for other sites and waits for their answers."""

    def __init__(
        self,
        *,
        db: Database,
        settings: SiteSettings,
        audit: AuditLog,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self._db = db
        self.site = site = settings.name
        self._audit = audit
        self._clock = clock
        self._resend_seconds = settings.resend_seconds
        # past the deadline: an answer the target sent just before it is still on its way
        self._grace = settings.answer_grace_seconds
        self.directory = SiteDirectory(site, on_online=self._target_online, clock=clock)
        # FARMHOST_MQTT_URL is set: the link is attached once the daemon has started
        self._enabled = settings.broker is not None
        self._attached = asyncio.Event()
        self._link: MqttLink | None = None
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._task: asyncio.Task[None] | None = None

    def handlers(self) -> Handlers:
        """The handler row the router uses for a farm action that names another site."""
        timeout = wire.MAX_DEADLINE_SECONDS + self._grace + 5.0
        return {
            SITE_HANDLER: HandlerSpec(
                effect=Effect.REMOTE, run=self._handle, timeout=timeout, on_refused=refusal_auditor(self._audit)
            )
        }

    def attach(self, link: MqttLink) -> None:
        """Use `link` (before it starts: its subscriptions are made at every connection)."""
        self._link = link
        self._attached.set()
        link.subscribe(wire.AVAILABILITY_ALL, self.directory.on_availability)
        link.subscribe(wire.answers_for(self.site), self._on_answer)

    def connected(self) -> None:
        """The link (re)connected: send everything not answered yet (the broker may have lost it)."""
        self._resend()

    async def start(self) -> None:
        """Send again what is unanswered every FARMHOST_SITE_RESEND_SECONDS, in the background."""
        self._task = asyncio.create_task(every(self._resend_seconds, self._resend), name="sites:resend")

    async def stop(self) -> None:
        """Stop sending (the rows stay: the next start sends them again)."""
        await cancel_and_wait(self._task)
        self._task = None

    async def _handle(self, ctx: RequestContext, request: AnyRequest) -> Outcome:
        assert isinstance(request, FarmActionRequest) and request.site is not None
        started = time.perf_counter()
        outcome = await self._call(ctx, request, request.site)
        self._audit.record(
            at=ctx.now,
            group=ctx.group.folder,
            request_id=ctx.request_id,
            action=request.action,
            params=request.params,
            error_code=outcome.error_code,
            duration_ms=round((time.perf_counter() - started) * 1000),
            extra={"site": request.site},
        )
        return outcome

    async def _call(self, ctx: RequestContext, request: FarmActionRequest, target: str) -> Outcome:
        if not ctx.group.is_main:
            return Outcome.failure(
                ErrorCode.UNAUTHORIZED, f"a farm action for another site ({target}) is only allowed from the main group"
            )
        if self._enabled:
            await self._attached.wait()  # a request recovered from the spool at start comes before the link
        if self._link is None:
            return Outcome.failure(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"cannot reach site {target}: sites talk over MQTT and FARMHOST_MQTT_URL is not set on {self.site}",
            )
        with self._db.tx(durable=False) as conn:
            call = site_calls.for_request(conn, ctx.group.folder, ctx.request_id)
        if call is None:
            unknown = await self._unknown(target)
            if unknown is not None:
                return unknown
            made = self._new_call(ctx, request, target)
            if isinstance(made, Outcome):
                return made
            call = made
        if call.status != "pending":
            return self._outcome(call)
        return await self._wait(call)

    async def _unknown(self, target: str) -> Outcome | None:
        """`not_found` when the broker is reachable and has never heard of `target`."""
        link = self._link
        assert link is not None
        if self.directory.get(target) is not None or link.connected_since is None:
            return None  # known, or the broker is away: queue it and let the deadline decide
        loop = asyncio.get_running_loop()
        settled = link.connected_since + DIRECTORY_SETTLE_SECONDS
        while loop.time() < settled:
            await asyncio.sleep(0.05)  # the retained availability topics are arriving
            if self.directory.get(target) is not None or link.connected_since is None:
                return None
        if self.directory.get(target) is not None or link.connected_since is None:
            return None
        return Outcome.failure(
            ErrorCode.NOT_FOUND,
            f"no site {target!r} on the MQTT broker; the sites it knows: {self.directory.listing()}",
        )

    def _new_call(self, ctx: RequestContext, request: FarmActionRequest, target: str) -> SiteCall | Outcome:
        deadline = self._deadline(ctx, request)
        body = request.model_dump(mode="json", exclude=set(_LOCAL_FIELDS), exclude_none=True)
        body["requestId"] = ctx.request_id
        call_id = uuid.uuid4().hex
        text = wire.encode(wire.Call(v=wire.VERSION, id=call_id, deadline=deadline, request=body))
        if len(text.encode()) > wire.MAX_MESSAGE_BYTES:
            return Outcome.failure(
                ErrorCode.INVALID_REQUEST, f"the request is too big to send to another site ({len(text)} bytes)"
            )
        call = SiteCall(
            id=call_id,
            group_folder=ctx.group.folder,
            request_id=ctx.request_id,
            target=target,
            message=text,
            deadline=deadline,
            status="pending",
        )
        with self._db.tx() as conn:
            site_calls.insert(conn, call, at=ctx.now)
        logger.info("sites: %s of %s sent to %s as call %s", request.action, ctx.group.folder, target, call_id)
        return call

    def _deadline(self, ctx: RequestContext, request: FarmActionRequest) -> datetime:
        latest = ctx.now + timedelta(seconds=wire.MAX_DEADLINE_SECONDS)
        own = request.expires_at(ctx.now) or ctx.now + timedelta(seconds=SITE_DEADLINE_SECONDS)
        return min(own, latest)

    async def _wait(self, call: SiteCall) -> Outcome:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters[call.id] = future
        self._send([call])
        wait = (call.deadline - self._clock()).total_seconds() + self._grace
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                await future
        except TimeoutError:
            pass
        finally:
            self._waiters.pop(call.id, None)
        now = self._clock()
        with self._db.tx() as conn:
            gave_up = site_calls.give_up(conn, call.id, at=now)
            latest = site_calls.get(conn, call.id)
        assert latest is not None
        if gave_up:
            logger.warning(
                "sites: no answer from %s to call %s by its deadline; not sent any more", call.target, call.id
            )
        return self._outcome(latest)

    def _outcome(self, call: SiteCall) -> Outcome:
        if call.status == "answered" and call.result is not None:
            remote = wire.RemoteResult.model_validate(call.result)
            if remote.status == "success":
                return Outcome(result=remote.result)
            code = wire.error_code(remote.errorCode)
            result = remote.result if code is ErrorCode.PENDING_APPROVAL else None
            return Outcome.failure(code, f"site {call.target}: {remote.error or code.value}", result)
        return self._unanswered(call)

    def _unanswered(self, call: SiteCall) -> Outcome:
        refuses = f"{call.target} refuses it after {utc_stamp(call.deadline)}"
        link = self._link
        if link is None or not link.connected:
            return Outcome.failure(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"the MQTT broker ({link.broker.shown if link else 'not set'}) was unreachable, so site {call.target} "
                f"could not be asked in time; it was not sent any more ({refuses})",
            )
        state = self.directory.get(call.target)
        if state is None or not state.online:
            since = f" since {utc_stamp(state.since)}" if state else ""
            return Outcome.failure(
                ErrorCode.UPSTREAM_UNAVAILABLE,
                f"site {call.target} is offline{since}; the request waited at the broker and did not run by its "
                f"deadline ({refuses})",
            )
        return Outcome.failure(
            ErrorCode.TIMEOUT,
            f"site {call.target} did not answer by the deadline; it may still have run the action there: check its "
            f"state before trying again ({refuses}); a site answers nothing to a site it does not trust (its "
            f"FARMHOST_SITES_TRUSTED must name {self.site})",
        )

    def _send(self, calls: list[SiteCall]) -> None:
        link = self._link
        if link is None or not calls:
            return
        for call in calls:
            link.publish_keyed(f"call:{call.id}", wire.request_topic(call.target, self.site), call.message)
        with self._db.tx(durable=False) as conn:
            site_calls.count_sent(conn, [call.id for call in calls])

    def _resend(self, target: str | None = None) -> None:
        with self._db.tx(durable=False) as conn:
            calls = site_calls.pending(conn, target)
            if target is None:
                site_calls.forget_old(conn, now=self._clock())
        # After a restart no one waits for an expired row any more: it is closed here, not sent.
        now = self._clock()
        live = [c for c in calls if c.deadline + timedelta(seconds=self._grace) > now or c.id in self._waiters]
        self._send(live)
        stale = [c for c in calls if c not in live]
        if stale:
            with self._db.tx() as conn:
                for call in stale:
                    site_calls.give_up(conn, call.id, at=now)

    def _target_online(self, site: str) -> None:
        self._resend(site)

    async def _on_answer(self, message: Incoming) -> None:
        sender = wire.sender_of(message.topic)
        try:
            answer, _ = wire.decode_answer(message.payload)
        except wire.BadMessage as err:
            logger.warning("sites: dropped a bad answer on %s: %s", message.topic, err)
            return
        with self._db.tx() as conn:
            call = site_calls.get(conn, answer.id)
            if call is None or call.target != sender:
                logger.warning("sites: dropped an answer from %s to call %s it was not asked", sender, answer.id)
                return
            stored = site_calls.answer(conn, answer.id, answer.result, at=self._clock())
        if not stored:
            logger.info("sites: answer to call %s from %s again (already answered or given up)", answer.id, sender)
            return
        future = self._waiters.get(answer.id)
        if future is not None and not future.done():
            future.set_result(answer.result)
