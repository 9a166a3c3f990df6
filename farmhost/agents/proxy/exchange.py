"""RunHandler: one run's exchanges with its agent: the budget reserved, the body read and prepared, an answer given.

Before a request goes upstream its bound in tokens is held against the group's day (proxy/budget.py); its answer,
buffered (UpstreamClient.forward) or streamed (proxy/stream.py), settles it however it ends, with the bound of each
endpoint given up on after it took the request added (it may have done the work). Every answer the proxy makes
itself is OpenAI-shaped (proxy/errors.py); the upstream's own answers pass through redacted. What every run shares (the upstream client, the
body parser, the budgets, the rules) is handed in by LlmProxy (proxy/server.py), which owns their lifetimes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
from aiohttp import web

from farmhost.agents.proxy.body import BodyRefused
from farmhost.agents.proxy.budget import BudgetExceeded, LlmBudgets, ProxyUsage, Reservation
from farmhost.agents.proxy.errors import error_json
from farmhost.agents.proxy.parse import BodyParser, PreparedBody
from farmhost.agents.proxy.stream import StreamRelay, StreamTally
from farmhost.agents.proxy.tokens import answer_tokens
from farmhost.agents.proxy.upstream import MAX_RESPONSE_BYTES, Attempts, UpstreamClient, failure_reason
from farmhost.config import LlmEndpoint

# The proxy's own log lines keep the logger name operators and tests know.
logger = logging.getLogger("farmhost.agents.proxy")

NOT_CONFIGURED: Final = (
    "no LLM is configured on the host: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL "
    "(and FARMHOST_LLM_API_KEY if the endpoint needs a key) in farmhost's environment or .env, then restart it"
)


@dataclass(frozen=True, kw_only=True)
class ExchangeRules:
    """The model, caps and deadlines every run's exchanges follow (from the settings, fixed for the daemon's life)."""

    model: str  # the one model /v1/models names
    max_tokens: int  # the cap on each request's max_tokens
    max_body_bytes: int  # the largest request body accepted (413 above)
    body_timeout: float  # seconds a request's body has to arrive (408 after)
    request_timeout: float  # seconds one exchange with the upstream may take, a stream's included
    stream_idle_timeout: float  # seconds a stream's upstream may send nothing
    write_timeout: float  # seconds the agent may take to read what a stream wrote


class UsageNotice:
    """Whether the daemon has said yet that a stream came without usage (one log line per daemon, not per request)."""

    def __init__(self) -> None:
        self._told = False

    def first(self) -> bool:
        """True the first time it is asked."""
        first, self._told = not self._told, True
        return first


def _error(status: int, message: str, kind: str, *, close: bool = False) -> web.Response:
    """An OpenAI-shaped error; `x-should-retry: false` stops the openai client from retrying what cannot succeed."""
    headers = {"x-should-retry": "false"} if status < 500 or status == 503 else {}
    if close:
        headers["Connection"] = "close"  # the rest of an unread body must not be parsed as the next request
    return web.Response(text=error_json(message, kind), status=status, headers=headers, content_type="application/json")


class RunHandler:
    """The request handlers of one run's socket."""

    def __init__(
        self,
        *,
        upstream: UpstreamClient,
        parser: BodyParser,
        budgets: LlmBudgets,
        rules: ExchangeRules,
        notice: UsageNotice,
        folder: str,
        run_id: str,
        usage: ProxyUsage,
        photos: Mapping[str, str] | None = None,
    ) -> None:
        """The handlers for run `run_id` of group `folder`, counting into `usage`; the rest is shared by every run.

        `photos`: the run's attached photos, data URL -> workspace path: the only images its requests may carry.
        """
        self._upstream = upstream
        self._parser = parser
        self._budgets = budgets
        self._rules = rules
        self._notice = notice
        self._folder = folder
        self._run_id = run_id
        self._usage = usage
        self._photos = dict(photos or {})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Check, rewrite and forward one chat completion request."""
        started = time.monotonic()
        response = await self._chat(request)
        self._log(response.status, started)
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not self._upstream.configured:
            return _error(503, NOT_CONFIGURED, "llm_not_configured")
        try:
            reservation = self._budgets.reserve(self._folder, self._usage)
        except BudgetExceeded as refused:
            return _error(429, refused.message, refused.kind)
        try:
            return await self._reserved(request, reservation)
        finally:
            self._budgets.release(reservation)  # a no-op once the request went upstream

    async def _reserved(self, request: web.Request, reservation: Reservation) -> web.StreamResponse:
        try:
            async with asyncio.timeout(self._rules.body_timeout):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is over {self._rules.max_body_bytes} bytes", "request_too_large")
        except TimeoutError:
            message = f"the request body did not arrive within {self._rules.body_timeout:g} s"
            return _error(408, message, "request_timeout", close=True)
        except (ConnectionError, web.RequestPayloadError) as err:
            # The client went away mid-body or sent a broken one; nobody may read this answer, but the log line says so.
            return _error(400, f"the request body could not be read ({err})", "invalid_request", close=True)
        try:
            body = await self._parser.prepare(raw, max_tokens=self._rules.max_tokens, photos=self._photos)
        except BodyRefused as err:
            return self._refused(str(err))
        del raw  # only the prepared bytes are held while the upstream answers
        try:
            self._budgets.commit(reservation, prompt=body.prompt_bound, completion=body.completion_bound)
        except BudgetExceeded as refused:
            return _error(429, refused.message, refused.kind)
        attempts = Attempts()
        if body.stream:
            tally = StreamTally(relay_usage=body.relay_usage)
            return await self._stream(request, body, reservation, attempts, tally)
        try:
            status, data, content_type, endpoint = await self._upstream.forward(body, attempts)
        except (TimeoutError, aiohttp.ClientError) as err:
            return self._unreachable(reservation, attempts, err, self._rules.request_timeout)
        return self._answer(reservation, attempts, status, data, content_type, endpoint, body)

    async def _stream(
        self,
        request: web.Request,
        body: PreparedBody,
        reservation: Reservation,
        attempts: Attempts,
        tally: StreamTally,
    ) -> web.StreamResponse:
        """Relay a streamed answer; its tokens are counted however it ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._rules.request_timeout
        headers_within = min(self._rules.request_timeout, self._rules.stream_idle_timeout)
        try:
            opened = await self._upstream.open(body, attempts, stream=True, headers_within=headers_within)
        except (TimeoutError, aiohttp.ClientError) as err:
            return self._unreachable(reservation, attempts, err, headers_within)
        endpoint = opened.endpoint
        async with opened.response as upstream:
            if upstream.status != 200 or upstream.content_type != "text/event-stream":
                try:  # an error, or an upstream that answers in one piece anyway
                    async with asyncio.timeout_at(deadline):
                        data = await self._upstream.read(upstream)
                except (TimeoutError, aiohttp.ClientError) as err:
                    attempts.failed(err)
                    return self._unreachable(reservation, attempts, err, self._rules.request_timeout)
                return self._answer(reservation, attempts, upstream.status, data, upstream.content_type, endpoint, body)
            self._answered(endpoint, body)
            extra = {"group": self._folder, "runId": self._run_id}
            relay = StreamRelay(
                tally=tally,
                redact=self._upstream.redact,
                total_timeout=self._rules.request_timeout,
                idle_timeout=self._rules.stream_idle_timeout,
                write_timeout=self._rules.write_timeout,
                max_bytes=MAX_RESPONSE_BYTES,
                name=f"llm {self._folder} run {self._run_id}",
                log_extra=extra,
            )
            try:
                return await relay.run(request, upstream, deadline)
            finally:
                if tally.done and tally.reported is None and self._notice.first():
                    logger.warning(
                        "llm %s run %s: the stream reported no usage; charging its bound (a token a byte of the "
                        "request, and its max_tokens) for this and later streams without usage",
                        self._folder,
                        self._run_id,
                        extra=extra,
                    )
                self._budgets.settle(reservation, tally.reported, given_up=attempts.timed_out)

    def _answer(
        self,
        reservation: Reservation,
        attempts: Attempts,
        status: int,
        data: bytes,
        content_type: str | None,
        endpoint: LlmEndpoint,
        body: PreparedBody,
    ) -> web.Response:
        if 200 <= status < 300:
            self._answered(endpoint, body)
            self._budgets.settle(reservation, answer_tokens(data), given_up=attempts.timed_out)
        else:  # the endpoint said it did not do it
            self._budgets.settle(reservation, (0, 0), given_up=attempts.timed_out)
            if status >= 500:
                self._usage.upstream_failures += 1
        return web.Response(status=status, body=data, content_type=content_type or "application/json")

    def _answered(self, endpoint: LlmEndpoint, body: PreparedBody) -> None:
        """Count a 2xx answer, and whether the endpoint that gave it got the run's photo as text only."""
        self._usage.upstream_answers += 1
        self._usage.answered_by[endpoint.number] = endpoint.label
        if body.images and not endpoint.vision:
            self._usage.unseen_by[endpoint.number] = endpoint.label

    def _refused(self, message: str) -> web.Response:
        """The 400 for a body that cannot be forwarded, logged with its reason (the agent's own answer says it too)."""
        extra = {"group": self._folder, "runId": self._run_id}
        logger.warning("llm %s run %s: request refused: %s", self._folder, self._run_id, message, extra=extra)
        return _error(400, message, "invalid_request")

    def _unreachable(
        self, reservation: Reservation, attempts: Attempts, err: BaseException, timeout: float
    ) -> web.Response:
        """The 502 for an upstream that did not answer in time or could not be reached, logged.

        Each endpoint that took the request and did not answer in time is charged its bound (it may have done the
        work); one that could not be connected to costs nothing.
        """
        self._budgets.settle(reservation, (0, 0), given_up=attempts.timed_out)
        self._usage.upstream_failures += 1
        extra = {"group": self._folder, "runId": self._run_id}
        several = len(self._upstream.endpoints) > 1
        which = f"any of the {len(self._upstream.endpoints)} LLM endpoints" if several else "the LLM endpoint"
        if isinstance(err, TimeoutError):
            logger.warning("llm %s run %s: no answer within %g s", self._folder, self._run_id, timeout, extra=extra)
            subject = f"none of the {len(self._upstream.endpoints)} LLM endpoints" if several else "the LLM endpoint"
            return _error(502, f"{subject} did not answer within {timeout:g} s", "upstream_timeout")
        assert isinstance(err, aiohttp.ClientError)
        logger.warning("llm %s run %s: upstream unreachable: %s", self._folder, self._run_id, err, extra=extra)
        last = " (the last one tried: " if several else " ("
        return _error(
            502, f"the host cannot reach {which}{last}{failure_reason(err, timeout)})", "upstream_unavailable"
        )

    def _log(self, status: int, started: float) -> None:
        usage = self._usage
        logger.info(
            "llm %s run %s: HTTP %d in %d ms (request %d of %d; tokens so far %d prompt, %d completion)",
            self._folder,
            self._run_id,
            status,
            (time.monotonic() - started) * 1000,
            usage.requests,
            usage.max_requests,
            usage.prompt_tokens,
            usage.completion_tokens,
            extra={"group": self._folder, "runId": self._run_id},
        )

    async def models(self, request: web.Request) -> web.Response:
        """The one model the proxy sends requests with."""
        if not self._upstream.configured:
            return _error(503, NOT_CONFIGURED, "llm_not_configured")
        model = {"id": self._rules.model, "object": "model", "created": 0, "owned_by": "farmhost"}
        return web.json_response({"object": "list", "data": [model]})

    async def unknown(self, request: web.Request) -> web.Response:
        """Anything else: a clear 404."""
        message = f"{request.method} {request.path} is not served; use POST /v1/chat/completions or GET /v1/models"
        return _error(404, message, "not_found")
