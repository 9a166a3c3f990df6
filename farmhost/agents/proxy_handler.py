"""RunHandler: the HTTP handlers of one run's LLM proxy socket: budget, body, then a buffered or a streamed answer.

Every answer the proxy makes itself is OpenAI-shaped (`{"error": {message, type, code}}`); the upstream's own answers
pass through redacted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp import web

from farmhost.agents.proxy_body import BodyRefused
from farmhost.agents.proxy_budget import BudgetExceeded, LlmBudgets, ProxyUsage, Reservation
from farmhost.agents.proxy_parse import PreparedBody
from farmhost.agents.proxy_stream import StreamTally
from farmhost.config import LlmEndpoint

if TYPE_CHECKING:
    from farmhost.agents.proxy import LlmProxy

# The proxy's own log lines keep the logger name operators and tests know.
logger = logging.getLogger("farmhost.agents.proxy")

NOT_CONFIGURED: Final = (
    "no LLM is configured on the host: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL "
    "(and FARMHOST_LLM_API_KEY if the endpoint needs a key) in farmhost's environment or .env, then restart it"
)


def _error(status: int, message: str, kind: str, *, close: bool = False) -> web.Response:
    """An OpenAI-shaped error; `x-should-retry: false` stops the openai client from retrying what cannot succeed."""
    body = {"error": {"message": message, "type": kind, "code": kind}}
    headers = {"x-should-retry": "false"} if status < 500 or status == 503 else {}
    if close:
        headers["Connection"] = "close"  # the rest of an unread body must not be parsed as the next request
    return web.json_response(body, status=status, headers=headers)


def _reported_tokens(data: bytes) -> tuple[int, int]:
    """The prompt and completion tokens an answer's `usage` reports (0, 0 when it reports none)."""
    try:
        reported = json.loads(data).get("usage") or {}
        prompt = max(0, int(reported.get("prompt_tokens") or 0))
        completion = max(0, int(reported.get("completion_tokens") or 0))
    except (ValueError, TypeError, AttributeError):
        return 0, 0  # no usage reported: nothing to count
    return prompt, completion


class RunHandler:
    """The request handlers of one run's socket."""

    def __init__(self, proxy: LlmProxy, budgets: LlmBudgets, folder: str, run_id: str, usage: ProxyUsage) -> None:
        self._proxy = proxy
        self._budgets = budgets
        self._folder = folder
        self._run_id = run_id
        self._usage = usage

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Check, rewrite and forward one chat completion request."""
        started = time.monotonic()
        response = await self._chat(request)
        self._log(response.status, started)
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if not self._proxy.configured:
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
            async with asyncio.timeout(self._proxy.body_timeout):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is over {self._proxy.max_body_bytes} bytes", "request_too_large")
        except TimeoutError:
            message = f"the request body did not arrive within {self._proxy.body_timeout:g} s"
            return _error(408, message, "request_timeout", close=True)
        except (ConnectionError, web.RequestPayloadError) as err:
            # The client went away mid-body or sent a broken one; nobody may read this answer, but the log line says so.
            return _error(400, f"the request body could not be read ({err})", "invalid_request", close=True)
        try:
            body = await self._proxy.prepare(raw)
        except BodyRefused as err:
            return self._refused(str(err))
        del raw  # only the prepared bytes are held while the upstream answers
        self._budgets.commit(reservation)
        if body.stream:
            return await self._stream(request, body, reservation, StreamTally(relay_usage=body.relay_usage))
        try:
            status, data, content_type, endpoint = await self._proxy.forward(body)
        except (TimeoutError, aiohttp.ClientError) as err:
            return self._unreachable(err, self._proxy.timeout)
        return self._answer(reservation, status, data, content_type, endpoint)

    async def _stream(
        self, request: web.Request, body: PreparedBody, reservation: Reservation, tally: StreamTally
    ) -> web.StreamResponse:
        """Relay a streamed answer; its tokens are counted however it ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._proxy.timeout
        headers_within = min(self._proxy.timeout, self._proxy.stream_idle_timeout)
        try:
            opened = await self._proxy.open(body, stream=True, headers_within=headers_within)
        except (TimeoutError, aiohttp.ClientError) as err:
            return self._unreachable(err, headers_within)
        endpoint = opened.endpoint
        async with opened.response as upstream:
            if upstream.status != 200 or upstream.content_type != "text/event-stream":
                try:  # an error, or an upstream that answers in one piece anyway
                    async with asyncio.timeout_at(deadline):
                        data = await self._proxy.read(upstream)
                except (TimeoutError, aiohttp.ClientError) as err:
                    return self._unreachable(err, self._proxy.timeout)
                return self._answer(reservation, upstream.status, data, upstream.content_type, endpoint)
            self._usage.upstream_answers += 1
            self._usage.answered_by[endpoint.number] = endpoint.label
            extra = {"group": self._folder, "runId": self._run_id}
            relay = self._proxy.relay(tally, f"llm {self._folder} run {self._run_id}", extra)
            try:
                return await relay.run(request, upstream, deadline)
            finally:
                if tally.done and tally.reported is None and self._proxy.usage_missing():
                    logger.warning(
                        "llm %s run %s: the stream reported no usage; counting tokens as an estimate "
                        "(4 characters a token) for this and later streams without usage",
                        self._folder,
                        self._run_id,
                        extra=extra,
                    )
                self._budgets.add_tokens(reservation, *tally.tokens(body.prompt_estimate))

    def _answer(
        self, reservation: Reservation, status: int, data: bytes, content_type: str | None, endpoint: LlmEndpoint
    ) -> web.Response:
        if 200 <= status < 300:
            self._usage.upstream_answers += 1
            self._usage.answered_by[endpoint.number] = endpoint.label
            self._budgets.add_tokens(reservation, *_reported_tokens(data))
        elif status >= 500:
            self._usage.upstream_failures += 1
        return web.Response(status=status, body=data, content_type=content_type or "application/json")

    def _refused(self, message: str) -> web.Response:
        """The 400 for a body that cannot be forwarded, logged with its reason (the agent's own answer says it too)."""
        extra = {"group": self._folder, "runId": self._run_id}
        logger.warning("llm %s run %s: request refused: %s", self._folder, self._run_id, message, extra=extra)
        return _error(400, message, "invalid_request")

    def _unreachable(self, err: BaseException, timeout: float) -> web.Response:
        """The 502 for an upstream that did not answer in time or could not be reached, logged."""
        self._usage.upstream_failures += 1
        extra = {"group": self._folder, "runId": self._run_id}
        several = len(self._proxy.endpoints) > 1
        which = f"any of the {len(self._proxy.endpoints)} LLM endpoints" if several else "the LLM endpoint"
        if isinstance(err, TimeoutError):
            logger.warning("llm %s run %s: no answer within %g s", self._folder, self._run_id, timeout, extra=extra)
            subject = f"none of the {len(self._proxy.endpoints)} LLM endpoints" if several else "the LLM endpoint"
            return _error(502, f"{subject} did not answer within {timeout:g} s", "upstream_timeout")
        assert isinstance(err, aiohttp.ClientError)
        logger.warning("llm %s run %s: upstream unreachable: %s", self._folder, self._run_id, err, extra=extra)
        last = " (the last one tried: " if several else " ("
        return _error(502, f"the host cannot reach {which}{last}{_reason(err)})", "upstream_unavailable")

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
        if not self._proxy.configured:
            return _error(503, NOT_CONFIGURED, "llm_not_configured")
        model = {"id": self._proxy.model, "object": "model", "created": 0, "owned_by": "farmhost"}
        return web.json_response({"object": "list", "data": [model]})

    async def unknown(self, request: web.Request) -> web.Response:
        """Anything else: a clear 404."""
        message = f"{request.method} {request.path} is not served; use POST /v1/chat/completions or GET /v1/models"
        return _error(404, message, "not_found")


def _reason(err: aiohttp.ClientError) -> str:
    """Why the upstream could not be reached, without its URL (which may carry credentials)."""
    if isinstance(err, aiohttp.ClientConnectorError) and err.os_error.errno:
        return os.strerror(err.os_error.errno)  # its own text names the address
    return type(err).__name__
