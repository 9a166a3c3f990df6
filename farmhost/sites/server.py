"""The target's side: farm actions other sites send here, run once under this site's own policy and ledger.

A call arrives on `farmhost/<this site>/rpc/<origin>/request` (the broker's ACL decides who may publish there)
and runs through this site's router as its main group would run it, with `<origin>.<call id>` as its request id:
the ledger makes a repeat (QoS 1 redelivery, the origin sending again after a reconnect) answer with the stored
result instead of running again, and a call that arrives after its deadline is answered `expired`, not run. The
answer goes back on `farmhost/<origin>/rpc/<this site>/answer`. A message that is not a call is logged and, when it
names its id, answered `invalid_request`; it never stops the link or another call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Final

from pydantic import ValidationError

from farmhost.protocol.codes import ErrorCode, Queue
from farmhost.protocol.envelope import Outcome, envelope
from farmhost.protocol.requests import FarmActionRequest
from farmhost.sites import wire
from farmhost.store.db import now_utc

if TYPE_CHECKING:
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


class SiteServer:
    """Runs the calls of other sites and answers them."""

    def __init__(
        self,
        *,
        site: str,
        link: MqttLink,
        router: Router,
        main_group: Callable[[], Group | None],
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self.site = site
        self._link = link
        self._router = router
        self._main_group = main_group
        self._clock = clock
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)
        self._tasks: set[asyncio.Task[None]] = set()
        link.subscribe(wire.calls_for(site), self._on_call)

    async def stop(self) -> None:
        """Stop the calls in progress (a call cut short is answered `interrupted` if it is sent again)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_call(self, message: Incoming) -> None:
        origin = wire.sender_of(message.topic)
        if origin is None or origin == self.site:
            logger.warning("sites: ignored a call on %s (not from another site)", message.topic)
            return
        if len(self._tasks) >= MAX_HELD:
            logger.warning("sites: dropped a call from %s: %d calls are held already (sent again later)", origin,
                           len(self._tasks))  # fmt: skip
            return
        task = asyncio.create_task(self._serve(origin, message.payload), name=f"sites:call-from-{origin}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, origin: str, payload: bytes) -> None:
        received = self._clock()
        try:
            call = wire.decode_call(payload)
        except wire.BadMessage as err:
            logger.warning("sites: a bad call from %s: %s", origin, err)
            if err.call_id is not None:
                self._answer(origin, err.call_id, self._refusal(ErrorCode.INVALID_REQUEST, f"not a call: {err}"))
            return
        problem = self._problem(call)
        if isinstance(problem, Outcome):
            self._answer(origin, call.id, self._refusal(problem.error_code or ErrorCode.INVALID_REQUEST,
                                                        problem.error or ""))  # fmt: skip
            return
        request, group = problem
        async with self._slots:
            answer = await self._router.execute(
                group, Queue.ACTIONS, request, f"{origin}.{call.id}", received_at=received, stale=False
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

    def _problem(self, call: wire.Call) -> Outcome | tuple[FarmActionRequest, Group]:
        try:
            request = FarmActionRequest.model_validate({**call.request, "expiresAt": call.deadline})
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "request"
            return Outcome.failure(
                ErrorCode.INVALID_REQUEST, f"the request is not a farm action: {where}: {first['msg']}"
            )
        if request.site is not None and request.site != self.site:
            return Outcome.failure(ErrorCode.NOT_ALLOWED, "a call is run where it is sent; it cannot be passed on")
        group = self._main_group()
        if group is None:
            return Outcome.failure(ErrorCode.NOT_FOUND, f"site {self.site} has no main group to run it as")
        return request, group

    def _refusal(self, code: ErrorCode, message: str) -> dict[str, object]:
        return envelope(
            request_id="-",
            kind="farm_action",
            action=None,
            outcome=Outcome.failure(code, message),
            executed_at=self._clock(),
            duration_ms=0,
        )

    def _answer(self, origin: str, call_id: str, document: dict[str, object]) -> None:
        text = wire.encode(wire.Answer(v=wire.VERSION, id=call_id, result=document))
        self._link.publish_keyed(f"answer:{origin}:{call_id}", wire.answer_topic(origin, self.site), text)
