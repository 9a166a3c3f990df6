"""ProxyListener: accepts a run's LLM proxy connections itself, within caps, with deadlines, and backs off on EMFILE.

aiohttp's own site would hand the socket to asyncio's accept loop, which holds every connection it can until the
daemon runs out of descriptors and then logs a traceback per failed accept. Here instead:
- a run may hold `per_run` connections and all runs together `caps.total` (at most a quarter of the descriptor
  limit); one more is answered at once with a 503 and closed, never held;
- a connection that is not inside a request (headers still arriving, or idle between requests, or a response the
  client will not read) is aborted after `idle_timeout`; bodies have their own deadline in the handler;
- an accept that fails (EMFILE, ENFILE, ENOBUFS, ...) is retried with backoff, and logged once when accepting stops
  working and once when it works again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from farmhost.agents.proxy.errors import error_json
from farmhost.background import cancel_and_wait

logger = logging.getLogger(__name__)

# After a failed accept, wait this long before the next try, doubling up to the maximum: a full descriptor table
# frees up when connections end, which takes at least a moment; two seconds keep a recovering daemon responsive.
ACCEPT_BACKOFF_MIN: Final = 0.05
ACCEPT_BACKOFF_MAX: Final = 2.0
# What a refused connection may have sent already is read off and dropped (a unix socket closed with unread data
# resets the peer, which would hide the 503 from it).
REFUSAL_DRAIN_BYTES: Final = 65536


# The proxy's connections together never take more than this share of the daemon's descriptor limit, whatever the
# settings say: the IPC engine, SQLite, logs and agent pipes need the rest.
NOFILE_SHARE: Final = 4


class _Untraced(logging.Filter):
    """aiohttp logs a traceback for each malformed request; an agent can send thousands a second. Keep a line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen += 1
        if self.seen != 1 and self.seen % 1000 != 0:
            return False
        error = record.exc_info[1] if record.exc_info else None
        first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else type(error).__name__
        record.msg, record.args = "llm proxy: a malformed request from an agent (%s); %d so far", (first, self.seen)
        record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
        return True


# The logger the proxy's aiohttp servers report protocol errors to (instead of aiohttp.server).
HTTP_ERRORS: Final = logging.getLogger(f"{__name__}.http")
HTTP_ERRORS.addFilter(_Untraced())


class ConnectionCaps:
    """The connections all of one proxy's run sockets hold together."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.open = 0

    def limit(self) -> int:
        """The cap now: the setting, at most a NOFILE_SHARE-th of the descriptor limit (read each time: it may change)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return self.total
        return max(1, min(self.total, soft // NOFILE_SHARE))


def refusal(status: int, message: str, kind: str) -> bytes:
    """A whole HTTP response with an OpenAI-shaped error body that closes the connection."""
    body = error_json(message, kind).encode()
    reason = {503: "Service Unavailable"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Retry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ProxyListener:
    """Serves one listening socket with an aiohttp `web.Server` as the protocol of each accepted connection."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        name: str,
        per_run: int,
        caps: ConnectionCaps,
        idle_timeout: float,
    ) -> None:
        self._sock = sock
        self._server: web.Server | None = None
        self._name = name
        self._per_run = per_run
        self._caps = caps
        self._idle_timeout = idle_timeout
        self._connections: dict[Any, _Tracked] = {}  # transport -> its connection
        self._task: asyncio.Task[None] | None = None
        self.refused = 0

    @property
    def open(self) -> int:
        """The connections this socket holds now."""
        return len(self._connections)

    def start(self, server: web.Server) -> None:
        """Begin accepting; each connection gets a handler of `server`."""
        self._server = server
        self._sock.setblocking(False)
        self._task = asyncio.get_running_loop().create_task(self._accept_loop(), name=f"llm-accept-{self._name}")

    async def stop(self) -> None:
        """Stop accepting and close the listening socket (connections are left to `abort_all`)."""
        await cancel_and_wait(self._task)
        self._task = None
        self._sock.close()

    def abort_all(self) -> None:
        """Drop every connection at once."""
        for tracked in list(self._connections.values()):
            tracked.abort()

    def middleware(self) -> Middleware:
        """An aiohttp middleware that stops a connection's idle deadline while a request is being handled."""

        @web.middleware
        async def inside_request(request: web.Request, handler: Handler) -> web.StreamResponse:
            tracked = self._connections.get(request.transport)
            if tracked is None:
                return await handler(request)
            tracked.busy(True)
            try:
                return await handler(request)
            finally:
                tracked.busy(False)

        return inside_request

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        delay, failing = ACCEPT_BACKOFF_MIN, False
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as err:
                if not failing:
                    failing = True
                    logger.error(
                        "llm proxy %s: cannot accept connections (%s); retrying with backoff until it can",
                        self._name,
                        err.strerror or err,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, ACCEPT_BACKOFF_MAX)
                continue
            if failing:
                failing, delay = False, ACCEPT_BACKOFF_MIN
                logger.info("llm proxy %s: accepting connections again", self._name)
            await self._admit(loop, conn)

    async def _admit(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        conn.setblocking(False)
        if self.open >= self._per_run:
            self._refuse(
                conn,
                f"too many connections to the LLM proxy from this run ({self.open} open); send one request at a time",
            )
            return
        if self._caps.open >= self._caps.limit():
            self._refuse(conn, f"too many connections to the LLM proxy from all runs ({self._caps.open}); try later")
            return
        assert self._server is not None
        tracked = _Tracked(self._server(), idle_timeout=self._idle_timeout, opened=self._added, closed=self._removed)
        self._caps.open += 1
        try:
            await loop.connect_accepted_socket(lambda: tracked, conn)
        except OSError:
            conn.close()
            tracked.forget()

    def _refuse(self, conn: socket.socket, message: str) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:  # a flood is worth a line, not a line per connection
            logger.warning("llm proxy %s: %s (%d refused so far)", self._name, message, self.refused)
        with contextlib.suppress(OSError):
            conn.send(refusal(503, message, "too_many_connections"))
            conn.shutdown(socket.SHUT_WR)
            conn.recv(REFUSAL_DRAIN_BYTES)
        conn.close()

    def _added(self, tracked: _Tracked, transport: Any) -> None:
        self._connections[transport] = tracked

    def _removed(self, tracked: _Tracked) -> None:
        if tracked.transport is not None:
            self._connections.pop(tracked.transport, None)
        self._caps.open -= 1


class _Tracked(asyncio.Protocol):
    """One accepted connection: aiohttp's handler inside, counted while open, aborted when idle too long."""

    def __init__(
        self,
        inner: Any,
        *,
        idle_timeout: float,
        opened: Callable[[_Tracked, asyncio.Transport], None],
        closed: Callable[[_Tracked], None],
    ) -> None:
        self._inner = inner
        self._idle_timeout = idle_timeout
        self._opened = opened
        self._closed = closed
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = 0
        self._gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._opened(self, transport)
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        result: bool | None = self._inner.eof_received()
        return result

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.forget()
        self._inner.connection_lost(exc)

    def forget(self) -> None:
        """No longer counted (idempotent)."""
        if not self._gone:
            self._gone = True
            self._closed(self)

    def busy(self, inside: bool) -> None:
        """A request is being handled (no idle deadline) or has been (the deadline runs again)."""
        self._busy += 1 if inside else -1
        if self._busy:
            self._disarm()
        else:
            self._arm()

    def abort(self) -> None:
        """Close at once, dropping what is unsent (a client that does not read cannot hold the descriptor)."""
        if self.transport is not None:
            self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(self._idle_timeout, self.abort)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
