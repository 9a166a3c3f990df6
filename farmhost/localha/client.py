"""Talking to the local Home Assistant: REST and WebSocket on aiohttp, behind blocking calls for tests and the demo.

The callers (tests, benchmarks, the demo's worker thread) are synchronous, some of them inside a thread whose own
event loop runs. So every call runs its coroutine on one event loop of this module's own, in a daemon thread, and
waits for the answer: a blocking call works from any thread, and a WebSocket session may be read in one thread and
closed from another.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Coroutine
from typing import Any, Final, Self, TypeVar

import aiohttp

from farmhost.localha.errors import HaHttpError, HaSetupError

DEFAULT_TIMEOUT_S: Final = 10.0  # a call to a local HA answers in milliseconds; 10 s means it is stuck
WS_MAX_MESSAGE: Final = 0  # no limit: `get_states` or a dashboard config may outgrow aiohttp's 4 MB default

T = TypeVar("T")


class _IoLoop:
    """One event loop in a daemon thread per process, started on first use (again in a forked child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and block until it is done; its exception is raised here."""
        return asyncio.run_coroutine_threadsafe(coro, self._running()).result()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="localha-io", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


_IO: Final = _IoLoop()


def _unreachable(what: str, err: aiohttp.ClientError) -> OSError:
    """An aiohttp failure as an OSError, which callers catch for "HA does not answer" (ServerDisconnectedError is none)."""
    if isinstance(err, OSError):
        return err
    return ConnectionError(f"{what}: {type(err).__name__}: {err}")


async def _request(method: str, url: str, token: str | None, body: Any, timeout: float) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.request(method, url, json=body, headers=headers) as response,
        ):
            raw = await response.read()
            status = response.status
    except aiohttp.ClientError as err:
        raise _unreachable(f"HA {url}", err) from err
    if status >= 400:
        raise HaHttpError(status, raw.decode(errors="replace"), url)
    return json.loads(raw) if raw else None


def http_json(method: str, url: str, token: str | None, body: Any = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """One REST call with a JSON body and answer.

    Args:
        method: GET, POST, DELETE...
        url: the whole URL (`http://127.0.0.1:<port>/api/...`).
        token: a bearer token, or None for an anonymous call.
        body: what to send as JSON (None: no body).
        timeout: seconds for the whole call.

    Returns:
        The decoded JSON answer (None for an empty one).

    Raises:
        HaHttpError: HA answered 4xx/5xx.
        OSError: HA is unreachable or dropped the connection (TimeoutError when it took too long).
    """
    return _IO.run(_request(method, url, token, body, timeout))


class WsSession:
    """An authenticated HA WebSocket session: `auth` is HA's answer to the token; then commands (context manager)."""

    def __init__(self, ws_url: str, token: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Connect and authenticate; a refused token is no error here (`auth["type"] == "auth_invalid"`).

        Args:
            ws_url: `ws://127.0.0.1:<port>/api/websocket`.
            token: the access token to authenticate with.
            timeout: seconds for connecting and for each message awaited (`recv`).
        """
        self._timeout = timeout
        self._next_id = 1
        self._session, self._ws = _IO.run(self._connect(ws_url))
        try:
            hello = self.recv()
            if hello.get("type") != "auth_required":
                raise HaSetupError(f"unexpected WebSocket greeting {hello}")
            self.send({"type": "auth", "access_token": token})
            self.auth = self.recv()  # {"type": "auth_ok" | "auth_invalid", ...}
        except BaseException:
            self.close()
            raise

    async def _connect(self, ws_url: str) -> tuple[aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]:
        session = aiohttp.ClientSession()
        try:
            async with asyncio.timeout(self._timeout):
                ws = await session.ws_connect(ws_url, max_msg_size=WS_MAX_MESSAGE)
        except aiohttp.WSServerHandshakeError as err:
            await session.close()
            raise ConnectionError(f"WebSocket handshake refused: HTTP {err.status} {err.message}") from None
        except BaseException as err:
            await session.close()
            if isinstance(err, aiohttp.ClientError):
                raise _unreachable(f"HA {ws_url}", err) from err
            raise
        return session, ws

    def send(self, message: dict[str, Any]) -> None:
        """Send one JSON message."""
        _IO.run(self._send(message))

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._ws.send_str(json.dumps(message))
        except aiohttp.ClientError as err:
            raise _unreachable("WebSocket send", err) from err

    def recv(self) -> dict[str, Any]:
        """The next JSON message from HA; ConnectionError once the session is closed, TimeoutError after `timeout`."""
        return _IO.run(self._recv())

    async def _recv(self) -> dict[str, Any]:
        while True:
            message = await self._ws.receive(timeout=self._timeout)
            if message.type is aiohttp.WSMsgType.TEXT:
                result: dict[str, Any] = json.loads(message.data)
                return result
            if message.type is aiohttp.WSMsgType.ERROR:
                raise ConnectionError(f"WebSocket error: {self._ws.exception()}")
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                raise ConnectionError("WebSocket closed by HA")
            # ping/pong are answered by aiohttp itself; HA sends no binary frames

    def command(self, type_: str, **payload: Any) -> dict[str, Any]:
        """Send one command and return HA's `result` message (`success`, `result` or `error`).

        Args:
            type_: the command type (`get_states`, `lovelace/config`, `config/auth/list`...).
            **payload: the command's fields besides `id` and `type`.

        Returns:
            HA's `result` message for this command; other messages (events of a subscription) are skipped.
        """
        msg_id, self._next_id = self._next_id, self._next_id + 1
        self.send({"id": msg_id, "type": type_, **payload})
        while True:
            answer = self.recv()
            if answer.get("id") == msg_id and answer.get("type") == "result":
                return answer

    def close(self) -> None:
        """Close the WebSocket (a close frame) and its HTTP session; a `recv` waiting in another thread ends."""
        _IO.run(self._close())

    async def _close(self) -> None:
        try:
            await self._ws.close()
        except (aiohttp.ClientError, OSError):
            pass  # HA already went away: nothing to say goodbye to
        finally:
            await self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HaClient:
    """REST and WebSocket calls to one HA as one user: `url`, `ws_url` and `token` (which may be set later)."""

    def __init__(self, url: str, token: str) -> None:
        """Point at an HA.

        Args:
            url: `http://127.0.0.1:<port>`.
            token: the access token calls are made with.
        """
        self.url = url
        self.ws_url = url.replace("http://", "ws://", 1) + "/api/websocket"
        self.token = token

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
        """One authenticated REST call (`path` starts with /api or /auth); the decoded JSON answer."""
        return http_json(method, self.url + path, self.token, body, timeout)

    def ws(self) -> WsSession:
        """A new authenticated WebSocket session (use as a context manager)."""
        return WsSession(self.ws_url, self.token)

    def get_states(self) -> list[dict[str, Any]]:
        """Every entity state (REST /api/states)."""
        states: list[dict[str, Any]] = self.api("GET", "/api/states")
        return states

    def get_state(self, entity_id: str) -> dict[str, Any]:
        """The raw state dict; raises HaHttpError(404) for an unknown entity."""
        state: dict[str, Any] = self.api("GET", f"/api/states/{entity_id}")
        return state

    def call_service(self, domain: str, service: str, data: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Call a service; returns the states it changed."""
        changed: list[dict[str, Any]] = self.api("POST", f"/api/services/{domain}/{service}", data or {})
        return changed

    def write_state(self, entity_id: str, state: str, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /api/states: overwrite (or create) a state in HA's state machine only; gone after a restart."""
        written: dict[str, Any] = self.api(
            "POST", f"/api/states/{entity_id}", {"state": state, "attributes": attributes or {}}
        )
        return written
