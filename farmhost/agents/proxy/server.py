"""LlmProxy: the OpenAI-compatible endpoint agents reach through a Unix socket; the host adds the key, forces the model.

One socket per running group, `<data>/run/<folder>/llm.sock` (`/workspace/run/llm.sock` in the sandbox), open for the
run's duration. Served: `POST /v1/chat/completions` (forwarded to `FARMHOST_LLM_BASE_URL` + `/chat/completions`)
and `GET /v1/models` (answered here: the configured model is the only one an agent can use). This module owns the
proxy's lifetime and each run's socket and HTTP server; the pieces it wires together own the rest:
connections accepted within caps and deadlines (proxy/listener.py), one run's exchanges (proxy/exchange.py), bodies
checked by a bounded scan and parsed off the event loop (proxy/parse.py) and rewritten to known fields
(proxy/body.py) with only the run's own photo as an image (proxy/images.py), every request reserved against the
run's and the group's daily budgets (proxy/budget.py), the endpoints tried in order with the key added and answers
redacted (proxy/upstream.py, proxy/chain.py), and streams relayed as they arrive (proxy/stream.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Final

from aiohttp import web

from farmhost.agents.limits import LimitsReader
from farmhost.agents.photos import PreparedPhoto
from farmhost.agents.proxy.budget import LlmBudgets, ProxyUsage
from farmhost.agents.proxy.context import ContextSize, ContextSizes
from farmhost.agents.proxy.exchange import ExchangeRules, RunHandler, UsageNotice
from farmhost.agents.proxy.listener import HTTP_ERRORS, ConnectionCaps, ProxyListener
from farmhost.agents.proxy.parse import BodyParser
from farmhost.agents.proxy.upstream import LLM_REQUEST_TIMEOUT, UpstreamClient
from farmhost.config import LlmSettings
from farmhost.layout import DataLayout
from farmhost.store.db import Database

SOCKET_NAME: Final = "llm.sock"
# A chat request carries the conversation and the tool schemas; 4 MiB is far beyond a turn-limited run's needs.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
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
__all__ = ["SOCKET_NAME", "LlmProxy"]


class LlmProxy:
    """Serves the LLM proxy socket of a group while one of its runs is going on."""

    def __init__(
        self,
        *,
        settings: LlmSettings,
        layout: DataLayout,
        limits: LimitsReader,
        request_timeout: float = LLM_REQUEST_TIMEOUT,
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_timeout: float = IDLE_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
        stream_idle_timeout: float | None = None,
    ) -> None:
        """A proxy for the daemon's runs; nothing opens before `start()`.

        Args:
            settings: the LLM endpoints in order, the connection caps, max_tokens, the farm's zone (the budgets' days).
            layout: the data directory (the run sockets, the database).
            limits: the limits file reader, the runtime's (so a broken file is reported once): each group's budgets.
            request_timeout: seconds the upstream has to answer one request.
            max_body_bytes: the largest request body accepted (413 above).
            idle_timeout: seconds a connection may stay outside a request before it is dropped.
            body_timeout: seconds a request's body has to arrive (408 after).
            stream_idle_timeout: seconds a stream's upstream may send nothing before the stream is cut (default:
                FARMHOST_LLM_STREAM_IDLE_TIMEOUT).
        """
        self._settings = settings
        self._layout = layout
        self._limits = limits
        self._idle_timeout = idle_timeout
        self.rules = ExchangeRules(
            model=settings.model,
            max_tokens=settings.max_tokens,
            max_body_bytes=max_body_bytes,
            body_timeout=body_timeout,
            request_timeout=request_timeout,
            stream_idle_timeout=(settings.stream_idle_timeout if stream_idle_timeout is None else stream_idle_timeout),
            write_timeout=idle_timeout,
        )
        self._notice = UsageNotice()
        self._caps = ConnectionCaps(settings.max_connections)
        self._db: Database | None = None
        self._budgets: LlmBudgets | None = None
        self._upstream = UpstreamClient(settings.endpoints, cooldown=settings.cooldown_seconds, timeout=request_timeout)
        self._parser = BodyParser()
        self._contexts = ContextSizes(settings.endpoints, setting=settings.context_tokens)

    async def start(self) -> None:
        """Open the budgets' database connection, the body parser and the upstream HTTP session (if configured)."""
        self._parser.start()
        if self._db is None:
            self._db = Database.open(self._layout.root)
            self._budgets = LlmBudgets(self._db, zone=self._settings.zone, budget=self._limits.llm_budget)
            self._budgets.prune()
        self._upstream.start()
        self._contexts.start()

    async def stop(self) -> None:
        """Close the upstream session, the body parser and the database connection."""
        self._parser.stop()
        await self._contexts.stop()
        await self._upstream.stop()
        if self._db is not None:
            self._db.close()
            self._db, self._budgets = None, None

    async def context_size(self) -> ContextSize | None:
        """The context a run's prompt must fit (proxy/context.py): the smallest the endpoints and the setting say."""
        return await self._contexts.for_run()

    @asynccontextmanager
    async def serve(
        self, folder: str, run_id: str, *, max_requests: int, photos: Sequence[PreparedPhoto] = ()
    ) -> AsyncIterator[ProxyUsage]:
        """Listen on `<data>/run/<folder>/llm.sock` for the block; yields the run's usage counters.

        `photos` are those the host attached to the run: the only images its requests may carry (proxy/images.py).

        Raises:
            OSError: the socket cannot be created.
        """
        assert self._budgets is not None, "start() the proxy first"
        usage = ProxyUsage(max_requests=max_requests)
        handler = RunHandler(
            upstream=self._upstream,
            parser=self._parser,
            budgets=self._budgets,
            rules=self.rules,
            notice=self._notice,
            folder=folder,
            run_id=run_id,
            usage=usage,
            photos={photo.data_url: photo.path for photo in photos},
        )
        directory = os.open(self._layout.create_group_run(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        runner: web.AppRunner | None = None
        listener: ProxyListener | None = None
        try:
            listener = ProxyListener(
                _bind(directory),
                name=f"{folder} run {run_id}",
                per_run=self._settings.run_connections,
                caps=self._caps,
                idle_timeout=self._idle_timeout,
            )
            app = web.Application(client_max_size=self.rules.max_body_bytes)
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
