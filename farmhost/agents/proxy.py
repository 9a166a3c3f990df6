"""LlmProxy: the OpenAI-compatible endpoint agents reach through a Unix socket; the host adds the key, forces the model.

One socket per running group, `<data>/run/<folder>/llm.sock` (`/workspace/run/llm.sock` in the sandbox), open for the
run's duration. Served: `POST /v1/chat/completions` (forwarded to `FARMHOST_LLM_BASE_URL` + `/chat/completions`)
and `GET /v1/models` (answered here: the configured model is the only one an agent can use). `stream: true` is relayed
as server-sent events as they arrive, with its usage counted (proxy_stream.py); any other answer is buffered, capped
and redacted. Connections are accepted within caps and deadlines (proxy_socket.py), bodies checked by a bounded scan
and parsed off the event loop (proxy_parse.py) and rewritten to known fields (proxy_body.py), and every request
reserved against the run's and the group's daily budgets (proxy_budget.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import aiohttp
from aiohttp import web

from farmhost.agents.limits import LimitsReader, default_limits, default_llm_budget
from farmhost.agents.proxy_budget import LlmBudgets, ProxyUsage
from farmhost.agents.proxy_chain import EndpointChain, Upstream, failure_reason
from farmhost.agents.proxy_handler import RunHandler
from farmhost.agents.proxy_parse import BodyParser, PreparedBody
from farmhost.agents.proxy_socket import HTTP_ERRORS, ConnectionCaps, ProxyListener
from farmhost.agents.proxy_stream import StreamRelay, StreamTally
from farmhost.config import LlmEndpoint, Settings
from farmhost.layout import DataLayout
from farmhost.store.db import Database

logger = logging.getLogger(__name__)

SOCKET_NAME: Final = "llm.sock"
# A chat request carries the conversation and the tool schemas; 4 MiB is far beyond a turn-limited run's needs.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# A hosted model answers in seconds, a model on a Pi's neighbour in minutes; the run's own timeout bounds it too.
LLM_REQUEST_TIMEOUT: Final = 300.0
# A connection to an endpoint is up within this long or the next endpoint is tried: a blackholed hosted endpoint (the
# farm's internet is down) must not hold a request for the whole LLM_REQUEST_TIMEOUT.
CONNECT_TIMEOUT: Final = 10.0
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
__all__ = ["SOCKET_NAME", "LlmProxy", "ProxyUsage"]


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
        stream_idle_timeout: float | None = None,
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
            stream_idle_timeout: seconds a stream's upstream may send nothing before the stream is cut (default:
                FARMHOST_LLM_STREAM_IDLE_TIMEOUT).
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
        self._stream_idle_timeout = (
            settings.llm_stream_idle_timeout if stream_idle_timeout is None else stream_idle_timeout
        )
        self._usage_missing_logged = False
        self._caps = ConnectionCaps(settings.llm_max_connections)
        self._session: aiohttp.ClientSession | None = None
        self._db: Database | None = None
        self._budgets: LlmBudgets | None = None
        self._chain = EndpointChain(settings.llm_endpoints, cooldown=settings.llm_cooldown_seconds)
        self._parser = BodyParser()

    async def start(self) -> None:
        """Open the budgets' database connection, the body parser and the upstream HTTP session (if configured)."""
        self._parser.start()
        if self._db is None:
            self._db = Database.open(self._settings.data_dir)
            self._budgets = LlmBudgets(self._db, zone=self._settings.zone, budget=self._limits.llm_budget)
            self._budgets.prune()
        if self._settings.llm_enabled and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))

    async def stop(self) -> None:
        """Close the upstream session, the body parser and the database connection."""
        self._parser.stop()
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
        handler = RunHandler(self, self._budgets, folder, run_id, usage)
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

    async def forward(self, body: PreparedBody) -> tuple[int, bytes, str, LlmEndpoint]:
        """POST `body` to the chat completions of the first endpoint that answers; status, body, type, endpoint.

        Raises:
            aiohttp.ClientError, TimeoutError: no endpoint could be reached or answered in time.
        """
        upstream = await self.open(body)
        async with upstream.response as response:
            return response.status, await self.read(response), response.content_type, upstream.endpoint

    async def open(self, body: PreparedBody, *, stream: bool = False, headers_within: float | None = None) -> Upstream:
        """POST `body` to each endpoint in the chain's order until one answers below 500; its response (headers in).

        An endpoint that cannot be reached, sends no headers within `headers_within` seconds or answers 5xx is
        marked failed (proxy_chain.py) and the next is tried; the last one's failure is what the caller gets. The
        caller releases the response. A stream has no aiohttp deadline: the caller bounds the rest of it.

        Raises:
            aiohttp.ClientError, TimeoutError: the last endpoint tried cannot be reached or does not answer in time.
        """
        order = self._chain.order()
        for index, endpoint in enumerate(order):
            after = order[index + 1] if index + 1 < len(order) else None
            try:
                async with asyncio.timeout(headers_within):
                    response = await self._post(endpoint, body, stream=stream)
            except (TimeoutError, aiohttp.ClientError) as err:
                self._chain.failed(endpoint, failure_reason(err, headers_within or self._timeout), next_one=after)
                if after is None:
                    raise
                continue
            if response.status < 500:
                self._chain.answered(endpoint)
                return Upstream(response=response, endpoint=endpoint, tried=index + 1)
            self._chain.failed(endpoint, f"HTTP {response.status}", next_one=after)
            if after is None:
                return Upstream(response=response, endpoint=endpoint, tried=index + 1)
            response.release()
        raise AssertionError("open() needs a configured LLM (see `configured`)")

    async def _post(self, endpoint: LlmEndpoint, body: PreparedBody, *, stream: bool) -> aiohttp.ClientResponse:
        assert self._session is not None
        accept = "text/event-stream" if stream else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        url = f"{endpoint.base_url}/chat/completions"
        total = None if stream else self._timeout
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=CONNECT_TIMEOUT)
        return await self._session.post(url, data=body.for_model(endpoint.model), headers=headers, timeout=timeout)

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """A buffered answer's body, redacted.

        Raises:
            aiohttp.ClientError: it is over MAX_RESPONSE_BYTES or cut.
        """
        data = bytearray()
        async for chunk in response.content.iter_any():  # read(n) stops at what has arrived so far
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise aiohttp.ClientPayloadError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
        return self.redact(bytes(data))

    async def prepare(self, raw: bytes) -> PreparedBody:
        """An agent's body checked, parsed and rewritten off the event loop (proxy_parse.py).

        Raises:
            BodyRefused: what is wrong with it, for the agent.
        """
        return await self._parser.prepare(raw, max_tokens=self.max_tokens)

    def relay(self, tally: StreamTally, name: str, extra: dict[str, str]) -> StreamRelay:
        """A relay for one stream with the proxy's deadlines and caps."""
        return StreamRelay(
            tally=tally,
            redact=self.redact,
            total_timeout=self._timeout,
            idle_timeout=self._stream_idle_timeout,
            write_timeout=self._idle_timeout,
            max_bytes=MAX_RESPONSE_BYTES,
            name=name,
            log_extra=extra,
        )

    def usage_missing(self) -> bool:
        """True the first time a stream came without usage (worth one log line per daemon, not one per request)."""
        first, self._usage_missing_logged = not self._usage_missing_logged, True
        return first

    @property
    def configured(self) -> bool:
        """An LLM endpoint is configured and the session is open."""
        return self._session is not None and bool(self._chain.endpoints)

    @property
    def endpoints(self) -> tuple[LlmEndpoint, ...]:
        """The endpoints in the operator's order (the first is FARMHOST_LLM_*)."""
        return self._chain.endpoints

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

    @property
    def stream_idle_timeout(self) -> float:
        """Seconds a stream's upstream may send nothing."""
        return self._stream_idle_timeout

    def redact(self, data: bytes) -> bytes:
        """`data` with every endpoint's API key replaced by `[redacted]`."""
        for endpoint in self._chain.endpoints:
            key = endpoint.api_key
            if key and len(key) >= 4:
                data = data.replace(key.encode(), b"[redacted]")
        return data


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
