"""The target's side: farm actions other sites send here, run once under this site's own policy and ledger.

A call arrives on `farmhost/<this site>/rpc/<origin>/request` and is served only when `<origin>` is a site this
one trusts (FARMHOST_SITES_TRUSTED). MQTT 3.1.1 does not tell a subscriber who published, so the guarantee rests on
two walls: the broker's ACL lets a login write only calls whose origin level is its own name (docs/mqtt.md), and
this server serves only the origins it trusts, whatever the broker lets through. A call from any other origin (a
device, Home Assistant, an unknown site) is logged once per origin and answered nothing. A retained call (the
broker would hand it again at every subscription) and a call whose deadline is further away than any site gives
are refused. A call runs through this site's router (`Router.run_as`, the door of every request the host runs
itself) as its main group would run it, with `<origin>.<call id>` as its request id: the ledger makes a repeat
(QoS 1 redelivery, the origin sending again after a reconnect) answer with the stored result instead of running
again, and a call that arrives after its deadline is answered `expired`, not run. The answer goes back on
`farmhost/<origin>/rpc/<this site>/answer`. A message that is not a call is logged and, when it names its id,
answered `invalid_request`; it never stops the link or another call. A trusted site's call refused before it
could run (retained, a deadline too far away, not a farm action) is audited like one refused while running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from pydantic import ValidationError

from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import Outcome, envelope, utc_stamp
from farmhost.protocol.field_errors import expectation, field_path
from farmhost.protocol.requests import FarmActionRequest
from farmhost.sites import wire
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    from farmhost.farm.audit import AuditLog
    from farmhost.ipc.router import Router
    from farmhost.mqtt.link import Incoming, MqttLink
    from farmhost.store.groups import Group

logger = logging.getLogger(__name__)

# Calls run at once from all other sites together; more wait their turn (a flood from one site cannot exhaust
# this one: each waits in memory, and the broker holds the rest).
MAX_CONCURRENT: Final = 8
# Calls held here at once, running or waiting; past that a call is dropped with a log line (a flood from a site
# must not fill this one's memory) and its origin sends it again later.
MAX_HELD: Final = 256
# A call's deadline may be this much further away than the furthest a site gives (wire.MAX_DEADLINE_SECONDS):
# the sites' clocks agree within seconds (NTP), and a target whose clock is a little behind must not refuse.
CLOCK_SKEW_SECONDS: Final = 30.0
# Untrusted origins remembered so each is logged once; the ACL should let none through, so past this many the
# log says so once and stays quiet (a broker without the ACL must not fill the log or this site's memory).
MAX_ORIGINS_LOGGED: Final = 1024
# Characters of a topic that names no site kept and logged for it.
MAX_TOPIC_SHOWN: Final = 120
# A refused call's `action` as its audit line and answer name it; a longer one is no farm action's name.
MAX_ACTION_CHARS: Final = 64


class SiteServer:
    """Runs the calls of other sites and answers them."""

    def __init__(
        self,
        *,
        site: str,
        trusted: frozenset[str],
        link: MqttLink,
        router: Router,
        audit: AuditLog,
        main_group: Callable[[], Group | None],
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self.site = site
        self.trusted = trusted - {site}
        self._link = link
        self._router = router
        self._audit = audit
        self._main_group = main_group
        self._clock = clock
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._tasks: set[asyncio.Task[None]] = set()
        self._untrusted_logged: set[str] = set()
        link.subscribe(wire.calls_for(site), self._on_call)
        if self.trusted:
            logger.info("sites: serving the calls of %s (FARMHOST_SITES_TRUSTED)", ", ".join(sorted(self.trusted)))
        else:
            logger.info("sites: serving no other site's calls (FARMHOST_SITES_TRUSTED names none)")

    async def stop(self) -> None:
        """Stop the calls in progress (a call cut short is answered `interrupted` if it is sent again)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_call(self, message: Incoming) -> None:
        origin = wire.sender_of(message.topic)
        if origin is None or origin not in self.trusted:
            # a topic is up to 64 KiB: its start names it well enough, and keeps 1,024 of them small
            self._untrusted(origin or message.topic[:MAX_TOPIC_SHOWN])
            return
        if len(self._tasks) >= MAX_HELD:
            logger.warning("sites: dropped a call from %s: %d calls are held already (sent again later)", origin,
                           len(self._tasks))  # fmt: skip
            return
        task = asyncio.create_task(
            self._serve(origin, message.payload, retained=message.retain), name=f"sites:call-from-{origin}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _untrusted(self, origin: str) -> None:
        """Log the first call of an origin this site does not trust; answer nothing (it is no site of ours)."""
        if origin in self._untrusted_logged or len(self._untrusted_logged) > MAX_ORIGINS_LOGGED:
            return
        self._untrusted_logged.add(origin)
        if len(self._untrusted_logged) > MAX_ORIGINS_LOGGED:
            logger.warning("sites: calls from more than %d untrusted origins; no more are logged", MAX_ORIGINS_LOGGED)
            return
        trusted = ", ".join(sorted(self.trusted)) or "none"
        logger.warning(
            "sites: calls from %r are not served and not answered: it is not a site this one trusts "
            "(FARMHOST_SITES_TRUSTED: %s; list a site there to serve it, and keep every other login out with the "
            "broker's ACL, docs/mqtt.md); logged once per origin",
            origin,
            trusted,
        )

    async def _serve(self, origin: str, payload: bytes, *, retained: bool) -> None:
        received = self._clock()
        try:
            call = wire.decode_call(payload)
        except wire.BadMessage as err:
            logger.warning("sites: a bad call from %s: %s", origin, err)
            if err.call_id is not None:
                refusal = Outcome.failure(ErrorCode.INVALID_REQUEST, f"not a call: {err}")
                self._refuse(origin, err.call_id, err.request, refusal, received=received)
            return
        problem = self._problem(call, received=received, retained=retained)
        if isinstance(problem, Outcome):
            logger.warning("sites: refused call %s from %s: %s", call.id, origin, problem.error)
            self._refuse(origin, call.id, call.request, problem, received=received)
            return
        request, group = problem
        async with self._slots:
            answer = await self._router.run_as(
                group, request, request_id=f"{origin}.{call.id}", via=f"site:{origin}", received_at=received
            )
        logger.info(
            "sites: %s from %s (call %s): %s%s",
            request.action,
            origin,
            call.id,
            answer.document.get("errorCode") or "success",
            " (the stored answer, not run again)" if answer.replayed else "",
        )
        self._answer(origin, call.id, answer.document)

    def _problem(
        self, call: wire.Call, *, received: datetime, retained: bool
    ) -> Outcome | tuple[FarmActionRequest, Group]:
        if retained:
            return Outcome.failure(
                ErrorCode.INVALID_REQUEST,
                "a retained call is not run (the broker would hand it again at every subscription); send it "
                "without the retain flag",
            )
        furthest = received + timedelta(seconds=wire.MAX_DEADLINE_SECONDS + CLOCK_SKEW_SECONDS)
        if call.deadline > furthest:
            return Outcome.failure(
                ErrorCode.INVALID_REQUEST,
                f"the call's deadline {utc_stamp(call.deadline)} is more than {wire.MAX_DEADLINE_SECONDS:g} s away "
                f"(this site's clock says {utc_stamp(received)}); a site gives a call at most "
                f"{wire.MAX_DEADLINE_SECONDS:g} s",
            )
        try:
            request = FarmActionRequest.model_validate({**call.request, "expiresAt": call.deadline})
        except ValidationError as err:
            errors = err.errors(include_url=False)
            where = field_path(errors[0]) or "request"
            return Outcome.failure(
                ErrorCode.INVALID_REQUEST, f"the request is not a farm action: {where}: {expectation(errors)}"
            )
        if request.site is not None and request.site != self.site:
            return Outcome.failure(ErrorCode.NOT_ALLOWED, "a call is run where it is sent; it cannot be passed on")
        group = self._main_group()
        if group is None:
            return Outcome.failure(ErrorCode.NOT_FOUND, f"site {self.site} has no main group to run it as")
        return request, group

    def _refuse(
        self,
        origin: str,
        call_id: str,
        request: Mapping[str, Any] | None,
        refusal: Outcome,
        *,
        received: datetime,
    ) -> None:
        """Audit a call refused before it could run (as every refused farm action) and answer it with why."""
        code = refusal.error_code or ErrorCode.INVALID_REQUEST
        request_id = f"{origin}.{call_id}"
        named = (request or {}).get("action")
        action = named if isinstance(named, str) and len(named) <= MAX_ACTION_CHARS else None
        main = self._main_group()
        self._audit.record(
            at=received,
            group=main.folder if main is not None else "-",
            request_id=request_id,
            action=action,
            params=(request or {}).get("params"),
            error_code=code,
            duration_ms=0,
        )
        document = envelope(
            request_id=request_id,
            kind="farm_action",
            action=action,
            outcome=Outcome.failure(code, refusal.error or code.value),
            executed_at=received,
            duration_ms=0,
        )
        self._answer(origin, call_id, document)

    def _answer(self, origin: str, call_id: str, document: dict[str, object]) -> None:
        text = wire.encode(wire.Answer(v=wire.VERSION, id=call_id, result=document))
        self._link.publish_keyed(f"answer:{origin}:{call_id}", wire.answer_topic(origin, self.site), text)
