"""LlmProxy: the OpenAI-compatible endpoint agents reach through a Unix socket; the host adds the key, forces the model.

One socket per running group, `<data>/run/<folder>/llm.sock` (`/workspace/run/llm.sock` in the sandbox), open for the
run's duration. Served: `POST /v1/chat/completions` (forwarded to `FARMHOST_LLM_BASE_URL` + `/chat/completions`)
and `GET /v1/models` (answered here: the configured model is the only one an agent can use). Streaming is refused
with a 400: the runner does not need it and a buffered answer is what lets the host count tokens and cap sizes.
Connections are accepted within caps and deadlines (proxy_socket.py), bodies rewritten to known fields
(proxy_body.py), and every request reserved against the run's and the group's daily budgets (proxy_budget.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import aiohttp
from aiohttp import web

from farmhost.agents.limits import LimitsReader, default_limits, default_llm_budget
from farmhost.agents.proxy_body import BodyRefused, rewrite
from farmhost.agents.proxy_budget import BudgetExceeded, LlmBudgets, ProxyUsage, Reservation
from farmhost.agents.proxy_socket import HTTP_ERRORS, ConnectionCaps, ProxyListener
from farmhost.config import Settings
from farmhost.layout import DataLayout
from farmhost.store.db import Database

logger = logging.getLogger(__name__)

SOCKET_NAME: Final = "llm.sock"
# A chat request carries the conversation and the tool schemas; 4 MiB is far beyond a turn-limited run's needs.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# A hosted model answers in seconds, a model on a Pi's neighbour in minutes; the run's own timeout bounds it too.
LLM_REQUEST_TIMEOUT: Final = 300.0
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
# A connection must be inside a request within this long of opening or of its last response: the agent's client sends
# a request's headers in one write, and an idle kept-alive connection is cheap to open again.
IDLE_TIMEOUT: Final = 15.0
# The body follows its headers at once from a client in the same machine; 30 s allows a 4 MiB body on a loaded Pi.
BODY_TIMEOUT: Final = 30.0
# The daemon's stop must fit in 10 s: a run's socket gives requests still going on this long, then drops them.
SHUTDOWN_TIMEOUT: Final = 1.0
# After an answer given without reading the whole body (a refusal), the rest is read and dropped for this long so the
# client reads the answer rather than a reset; aiohttp's 10 s would let a slow body hold the connection that long.
LINGER_TIME: Final = 2.0
# Header lines one request may send; an OpenAI client sends about ten.
MAX_HEADERS: Final = 32
# Requests a run may make per allowed turn: a turn is one request, retries and the final answer need a few more.
REQUESTS_PER_TURN: Final = 4
NOT_CONFIGURED: Final = (
    "no LLM is configured on the host: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL "
    "(and FARMHOST_LLM_API_KEY if the endpoint needs a key) in farmhost's environment or .env, then restart it"
)

__all__ = ["SOCKET_NAME", "LlmProxy", "ProxyUsage"]


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


class LlmProxy:
    """Serves the LLM proxy socket of a group while one of its runs is going on."""

    def __init__(
        self,
        *,
        settings: Settings,
        layout: DataLayout,
        limits: LimitsReader | None = None,
        request_timeout: float = LLM_REQUEST_TIMEOUT,
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_timeout: float = IDLE_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        """A proxy for the daemon's runs; nothing opens before `start()`.

        Args:
            settings: the LLM endpoint, the connection caps, max_tokens and the default daily budgets.
            layout: the data directory (the run sockets, agent-limits.json, the database).
            limits: the limits file reader (the runtime's, so a broken file is reported once); default: a new one.
            request_timeout: seconds the upstream has to answer one request.
            max_body_bytes: the largest request body accepted (413 above).
            idle_timeout: seconds a connection may stay outside a request before it is dropped.
            body_timeout: seconds a request's body has to arrive (408 after).
        """
        self._settings = settings
        self._layout = layout
        self._limits = limits or LimitsReader(
            layout.agent_limits, default_limits(settings), default_llm_budget(settings)
        )
        self._timeout = request_timeout
        self._max_body = max_body_bytes
        self._idle_timeout = idle_timeout
        self._body_timeout = body_timeout
        self._caps = ConnectionCaps(settings.llm_max_connections)
        self._session: aiohttp.ClientSession | None = None
        self._db: Database | None = None
        self._budgets: LlmBudgets | None = None

    async def start(self) -> None:
        """Open the budgets' database connection and the upstream HTTP session (when an LLM is configured)."""
        if self._db is None:
            self._db = Database.open(self._settings.data_dir)
            self._budgets = LlmBudgets(self._db, zone=self._settings.zone, budget=self._limits.llm_budget)
            self._budgets.prune()
        if self._settings.llm_enabled and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))

    async def stop(self) -> None:
        """Close the upstream session and the database connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._db is not None:
            self._db.close()
            self._db, self._budgets = None, None

    @asynccontextmanager
    async def serve(self, folder: str, run_id: str, *, max_requests: int) -> AsyncIterator[ProxyUsage]:
        """Listen on `<data>/run/<folder>/llm.sock` for the block; yields the run's usage counters.

        Raises:
            OSError: the socket cannot be created.
        """
        assert self._budgets is not None, "start() the proxy first"
        usage = ProxyUsage(max_requests=max_requests)
        handler = _RunHandler(self, self._budgets, folder, run_id, usage)
        directory = os.open(self._layout.create_group_run(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        runner: web.AppRunner | None = None
        listener: ProxyListener | None = None
        try:
            listener = ProxyListener(
                _bind(directory),
                name=f"{folder} run {run_id}",
                per_run=self._settings.llm_run_connections,
                caps=self._caps,
                idle_timeout=self._idle_timeout,
            )
            app = web.Application(client_max_size=self._max_body)
            app.router.add_post("/v1/chat/completions", handler.chat_completions)
            app.router.add_get("/v1/models", handler.models)
            app.router.add_route("*", "/{tail:.*}", handler.unknown)
            runner = web.AppRunner(
                app,
                access_log=None,
                handle_signals=False,
                shutdown_timeout=SHUTDOWN_TIMEOUT,
                keepalive_timeout=self._idle_timeout,
                max_headers=MAX_HEADERS,
                lingering_time=LINGER_TIME,
                logger=HTTP_ERRORS,
            )
            app.middlewares.append(listener.middleware())
            await runner.setup()
            assert runner.server is not None
            listener.start(runner.server)
            yield usage
        finally:
            if listener is not None:
                await listener.stop()
            if runner is not None:
                await runner.cleanup()
            if listener is not None:
                listener.abort_all()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SOCKET_NAME, dir_fd=directory)
            os.close(directory)

    async def forward(self, body: dict[str, Any]) -> tuple[int, bytes, str]:
        """POST `body` to the upstream's chat completions; returns status, body and content type.

        Raises:
            aiohttp.ClientError, TimeoutError: the upstream cannot be reached or does not answer in time.
        """
        assert self._session is not None and self._settings.llm_base_url is not None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._settings.llm_api_key:
            headers["Authorization"] = f"Bearer {self._settings.llm_api_key}"
        url = f"{self._settings.llm_base_url}/chat/completions"
        async with self._session.post(url, data=json.dumps(body).encode(), headers=headers) as response:
            data = bytearray()
            async for chunk in response.content.iter_any():  # read(n) stops at what has arrived so far
                data += chunk
                if len(data) > MAX_RESPONSE_BYTES:
                    raise aiohttp.ClientPayloadError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
            return response.status, self._redact(bytes(data)), response.content_type

    @property
    def configured(self) -> bool:
        """An LLM endpoint is configured and the session is open."""
        return self._session is not None

    @property
    def model(self) -> str:
        """The model every request is sent with."""
        return self._settings.llm_model or ""

    @property
    def max_tokens(self) -> int:
        """The cap on each request's max_tokens."""
        return self._settings.llm_max_tokens

    @property
    def body_timeout(self) -> float:
        """Seconds a request's body has to arrive."""
        return self._body_timeout

    @property
    def max_body_bytes(self) -> int:
        """The largest request body accepted."""
        return self._max_body

    @property
    def timeout(self) -> float:
        """The upstream request timeout in seconds."""
        return self._timeout

    def _redact(self, data: bytes) -> bytes:
        key = self._settings.llm_api_key
        return data.replace(key.encode(), b"[redacted]") if key and len(key) >= 4 else data


def _bind(directory: int) -> socket.socket:
    """A listening socket at `llm.sock` in `directory`, bound through `/proc/self/fd` (sun_path is 108 bytes)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET_NAME, dir_fd=directory)  # left by a daemon that was killed
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        short = f"/proc/self/fd/{directory}/{SOCKET_NAME}"
        sock.bind(short)
        os.chmod(short, 0o666)  # the sandbox's uid may differ from the daemon's; run/ itself is 0700
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


class _RunHandler:
    """The request handlers of one run's socket."""

    def __init__(self, proxy: LlmProxy, budgets: LlmBudgets, folder: str, run_id: str, usage: ProxyUsage) -> None:
        self._proxy = proxy
        self._budgets = budgets
        self._folder = folder
        self._run_id = run_id
        self._usage = usage

    async def chat_completions(self, request: web.Request) -> web.Response:
        """Check, rewrite and forward one chat completion request."""
        started = time.monotonic()
        response = await self._chat(request)
        self._log(response.status, started)
        return response

    async def _chat(self, request: web.Request) -> web.Response:
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

    async def _reserved(self, request: web.Request, reservation: Reservation) -> web.Response:
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
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON", "invalid_request")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_request")
        try:
            body = rewrite(body, model=self._proxy.model, max_tokens=self._proxy.max_tokens)
        except BodyRefused as err:
            return _error(400, str(err), "invalid_request")
        self._budgets.commit(reservation)
        try:
            status, data, content_type = await self._proxy.forward(body)
        except TimeoutError:
            logger.warning(
                "llm %s run %s: no answer within %g s",
                self._folder,
                self._run_id,
                self._proxy.timeout,
                extra={"group": self._folder, "runId": self._run_id},
            )
            return _error(502, f"the LLM endpoint did not answer within {self._proxy.timeout:g} s", "upstream_timeout")
        except aiohttp.ClientError as err:
            logger.warning(
                "llm %s run %s: upstream unreachable: %s",
                self._folder,
                self._run_id,
                err,
                extra={"group": self._folder, "runId": self._run_id},
            )
            return _error(502, f"the host cannot reach the LLM endpoint ({_reason(err)})", "upstream_unavailable")
        if 200 <= status < 300:
            self._budgets.add_tokens(reservation, *_reported_tokens(data))
        return web.Response(status=status, body=data, content_type=content_type or "application/json")

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
