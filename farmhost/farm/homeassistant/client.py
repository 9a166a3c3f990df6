"""The Home Assistant client: REST and WebSocket with timeouts, typed errors and a reconnecting socket.

Built on `homeassistant-api` (REST `AsyncClient`, WebSocket `AsyncWebsocketClient` with its generic
`send`/`recv_result`), reached through ha_transport.py, which is imported only when a client starts.
Everything the library can raise, and every transport error of `niquests` under it, is translated here into
one of the `Ha*` errors (defined in ha_errors.py, imported from here by everyone), each carrying the IPC
error code the agent sees.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import time
from http import HTTPMethod, HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, Self

from farmhost.farm.homeassistant.errors import (
    HaAuthFailed,
    HaError,
    HaNotFound,
    HaRejected,
    HaTimeout,
    HaUnavailable,
    transport_reason,
    ws_error,
)

if TYPE_CHECKING:
    from farmhost.farm.homeassistant.transport import AsyncWebsocketClient, HttpStatusError, RestClient

__all__ = [
    "REQUEST_TIMEOUT",
    "HAClient",
    "HaAuthFailed",
    "HaError",
    "HaNotFound",
    "HaRejected",
    "HaTimeout",
    "HaUnavailable",
]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT: Final = 10.0
# A reused WebSocket idle for longer than this is pinged before a command, so that a connection HA dropped
# (it restarted) is replaced before the command is sent, and no command is ever sent twice.
WS_IDLE_CHECK_SECONDS: Final = 1.0
# An idle WebSocket is closed after this long. Nobody reads an idle socket, and HA, when it stops, waits up to
# 10 s for each client to answer its close frame: an open idle socket would delay every HA restart by 10 s.
# Reopening costs one HTTP upgrade and the auth exchange (~15 ms on a LAN).
WS_IDLE_CLOSE_SECONDS: Final = 3.0
_POLL_SECONDS: Final = 0.25
# While a restart is waited for to take HA down: a poll must land in the window between the old HA leaving RUNNING
# and the new one reaching it, or the wait sees RUNNING throughout and times out. HA stops and starts again in
# seconds (~7 s here, 30-90 s on a Pi), but a preloaded one in ~0.3 s (the local HA's supervisor); a /api/config on
# the same network is cheap for the second or so that the stop takes.
_GONE_POLL_SECONDS: Final = 0.05
_UNAVAILABLE_STATUSES: Final = frozenset(
    {HTTPStatus.BAD_GATEWAY, HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.GATEWAY_TIMEOUT}
)
_ENTITY_ID_RE: Final = re.compile(r"[a-z0-9_]+\.[a-z0-9_]+")


class _Link(enum.Enum):
    """What farmhost last saw of HA, so that a change is logged once rather than at every call."""

    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"
    AUTH_FAILED = "auth_failed"


class HAClient:
    """One Home Assistant instance: REST calls plus one lazily (re)connected WebSocket, all with timeouts.

    Safe to share between concurrent tasks: REST calls run in parallel over a connection pool, WebSocket
    commands are serialised on the one socket. The token is held here only; it is never logged or repr'd.
    """

    def __init__(self, *, url: str, token: str, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.ws_url = ("wss" if self.url.startswith("https") else "ws") + "://" + self.url.split("://", 1)[1]
        self.ws_url += "/api/websocket"
        self._token = token.strip()
        self.request_timeout = request_timeout
        self._rest: RestClient | None = None
        self._ws: AsyncWebsocketClient | None = None
        self._ws_used_at = 0.0
        self._ws_lock = asyncio.Lock()
        self._ws_closer: asyncio.Task[None] | None = None
        self._link = _Link.UNKNOWN
        self._running_confirmed = False

    def __repr__(self) -> str:
        return f"HAClient({self.url!r})"  # never the token

    async def start(self) -> None:
        """Open the HTTP session; does not require HA to be up (calls fail with HaUnavailable until it is)."""
        if self._rest is None:
            from farmhost.farm.homeassistant import transport as ha_transport

            self._rest = ha_transport.new_rest_client(self.url, self._token)

    async def close(self) -> None:
        """Close the WebSocket and the HTTP session; safe to call twice."""
        async with self._ws_lock:
            await self._ws_drop()
        if self._ws_closer is not None:
            closer, self._ws_closer = self._ws_closer, None
            closer.cancel()
            await asyncio.gather(closer, return_exceptions=True)
        if self._rest is not None:
            rest, self._rest = self._rest, None
            await rest.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # REST ----------------------------------------------------------------------------------------------

    async def get_config(self) -> dict[str, Any]:
        """GET /api/config (its `state` is RUNNING once HA has started)."""
        config = await self._request(HTTPMethod.GET, "config")
        if not isinstance(config, dict):
            raise HaError("Home Assistant answered /api/config with something that is not an object")
        self._running_confirmed = config.get("state") == "RUNNING"
        return config

    async def is_running(self) -> bool:
        """True when /api/config answers with state RUNNING; False when HA is unreachable or still starting."""
        try:
            config = await self.get_config()
        except (HaUnavailable, HaTimeout):
            return False
        return config.get("state") == "RUNNING"

    async def wait_running(self, *, timeout: float) -> float:
        """Wait until HA is RUNNING; return the seconds waited; HaTimeout when it is not within `timeout`."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HaTimeout(f"Home Assistant at {self.url} was not RUNNING within {timeout:g} s")
            try:
                async with asyncio.timeout(min(remaining, self.request_timeout)):
                    if await self.is_running():
                        return time.monotonic() - start
            except TimeoutError:
                continue
            await asyncio.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    async def get_states(self) -> list[dict[str, Any]]:
        """GET /api/states: raw state dicts {entity_id, state, attributes, last_changed, last_updated}."""
        await self._ensure_running()
        states = await self._request(HTTPMethod.GET, "states")
        if not isinstance(states, list):
            raise HaError("Home Assistant answered /api/states with something that is not a list")
        return [s for s in states if isinstance(s, dict)]

    async def get_state(self, entity_id: str) -> dict[str, Any]:
        """GET /api/states/<entity_id>; HaNotFound when HA does not know the entity."""
        if not _ENTITY_ID_RE.fullmatch(entity_id):  # it becomes part of a URL path: never let `..` or `/` through
            raise HaRejected(f"{entity_id!r} is not a valid entity id (lower-case domain.object_id)")
        await self._ensure_running()
        state = await self._request(HTTPMethod.GET, f"states/{entity_id}", what=f"entity {entity_id}")
        if not isinstance(state, dict):
            raise HaError(f"Home Assistant answered the state of {entity_id} with something that is not an object")
        return state

    async def call_service(
        self, domain: str, service: str, data: dict[str, Any], *, target: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Call `domain.service` with `data` and return the states HA reports as changed by the call.

        The call goes over the WebSocket (HA explains a refusal there, where REST answers a bare 400); the
        changed states are those whose context is the call's own, which is how HA's REST API collects them.
        `target` ({entity_id|device_id|area_id|...}) may also be given inside `data`; HA accepts both forms.
        """
        await self._ensure_running()
        payload: dict[str, Any] = {"domain": domain, "service": service, "service_data": data}
        if target:
            payload["target"] = target
        result = await self._ws_call("call_service", payload, what=f"{domain}.{service}")
        context_id = (result or {}).get("context", {}).get("id") if isinstance(result, dict) else None
        if not context_id:
            return []
        return [s for s in await self.get_states() if (s.get("context") or {}).get("id") == context_id]

    async def restart(self, *, timeout: float) -> float:
        """homeassistant.restart through the API, then wait until HA is RUNNING again; return the seconds taken.

        HA silently ignores a restart requested before it is RUNNING, so that case is refused (HaUnavailable).
        """
        start = time.monotonic()
        deadline = start + timeout
        config = await self.get_config()
        if config.get("state") != "RUNNING":
            raise HaUnavailable(
                f"Home Assistant is not RUNNING yet (state {config.get('state')!r}) and would ignore a restart; "
                "try again in a few seconds"
            )
        # HA stops before it answers: the socket closing after the command was sent is the expected answer.
        restart = {"domain": "homeassistant", "service": "restart"}
        await self._ws_call("call_service", restart, what="homeassistant.restart", goodbye_ok=True)
        async with self._ws_lock:  # close it now: a stopping HA waits for its clients' close frames
            await self._ws_drop()
        self._running_confirmed = False
        self._link = _Link.DOWN  # expected: no "unreachable" warning for it, and "reachable again" once it is back
        log.warning("Home Assistant at %s is restarting (requested by a farm action)", self.url)
        # HA checks its configuration, answers, then stops: wait for it to go away before waiting for it back.
        while await self.is_running():
            if time.monotonic() >= deadline:
                raise HaTimeout(f"Home Assistant accepted the restart but was still running after {timeout:g} s")
            await asyncio.sleep(_GONE_POLL_SECONDS)
        await self.wait_running(timeout=max(0.0, deadline - time.monotonic()))
        return time.monotonic() - start

    async def _ensure_running(self) -> None:
        """After HA was lost (or before the first call), make sure it is RUNNING before using it."""
        if self._running_confirmed:
            return
        config = await self.get_config()
        if config.get("state") != "RUNNING":
            raise HaUnavailable(
                f"Home Assistant at {self.url} is starting (state {config.get('state')!r}); try again in a few seconds"
            )

    async def _request(self, method: HTTPMethod, path: str, *, body: Any = None, what: str | None = None) -> Any:
        if self._rest is None:
            await self.start()
        assert self._rest is not None
        from farmhost.farm.homeassistant import transport as t

        kwargs: dict[str, Any] = {"method": method, "timeout": self.request_timeout}
        if body is not None:
            kwargs["json"] = body
        try:
            async with asyncio.timeout(self.request_timeout):
                data = await self._rest.request(path, **kwargs)
        except t.HttpStatusError as err:
            self._http_failed(err, path=path, what=what)
        except t.TIMEOUTS as err:
            if isinstance(err, t.CONNECT_TIMEOUT):
                self._lost(f"no connection within {self.request_timeout:g} s")
            raise HaTimeout(f"Home Assistant did not answer within {self.request_timeout:g} s ({path})") from None
        except t.REQUEST_FAILED as err:
            self._lost(transport_reason(err))
        except t.UNREADABLE as err:
            raise HaError(f"Home Assistant's answer to {path} could not be read: {err}") from None
        self._up()
        return data

    def _http_failed(self, err: HttpStatusError, *, path: str, what: str | None) -> NoReturn:
        status, body = err.status, err.body
        if status == HTTPStatus.UNAUTHORIZED:
            self._auth_failed()
        if status in _UNAVAILABLE_STATUSES:
            self._lost(f"HTTP {status} from {self.url}")
        self._up()
        if status == HTTPStatus.NOT_FOUND and what is not None:
            raise HaNotFound(f"Home Assistant has no {what}")
        if status == HTTPStatus.NOT_FOUND:
            raise HaError(f"Home Assistant has no API endpoint /api/{path} (is the `api` integration loaded?)")
        if status < HTTPStatus.INTERNAL_SERVER_ERROR:
            raise HaRejected(f"Home Assistant refused {path} (HTTP {status}): {body}")
        raise HaError(f"Home Assistant failed on {path} (HTTP {status}): {body}")

    # WebSocket -----------------------------------------------------------------------------------------

    async def ws_command(self, command: str, **payload: Any) -> Any:
        """Send one WebSocket command ({"type": command, **payload}) and return its result; reconnects once.

        A connection HA dropped (it restarted) is detected before the command is sent (a ping when the
        socket was idle) and replaced once, so the command itself is sent exactly once. HA's refusals map
        to HaNotFound (`not_found`, `config_not_found`), HaAuthFailed (`unauthorized`), HaRejected (other
        client errors such as `invalid_format`, `unknown_command`) or HaError (`home_assistant_error`, ...).
        """
        return await self._ws_call(command, payload, what=command)

    async def _ws_call(self, command: str, payload: dict[str, Any], *, what: str, goodbye_ok: bool = False) -> Any:
        """Run one command; with `goodbye_ok`, HA closing the socket after receiving it counts as done (restart)."""
        from farmhost.farm.homeassistant import transport as t

        sent = False
        try:
            async with asyncio.timeout(self.request_timeout), self._ws_lock:
                ws = await self._ws_ready()
                try:
                    msg_id = await ws.send(command, **payload)
                    sent = True
                    result = (await ws.recv_result(msg_id)).result
                except t.WsRefusal as err:  # HA answered, with an error: the socket is still good
                    self._ws_used_at = time.monotonic()
                    raise ws_error(str(err), what) from None
                except BaseException:
                    await self._ws_drop()  # half a conversation: never reuse that socket
                    raise
                self._ws_used_at = time.monotonic()
                return result
        except TimeoutError:
            raise HaTimeout(f"Home Assistant did not answer {what} within {self.request_timeout:g} s") from None
        except t.SOCKET_FAILED as err:
            if isinstance(err, t.AuthRefused):
                self._auth_failed()
            if sent and goodbye_ok:
                return None
            self._lost(transport_reason(err))

    async def _ws_ready(self) -> AsyncWebsocketClient:
        """The open socket, checked with a ping when idle; a new one when there is none or it is dead."""
        from farmhost.farm.homeassistant import transport as t

        if self._ws is not None and time.monotonic() - self._ws_used_at > WS_IDLE_CHECK_SECONDS:
            try:
                await self._ws.recv_ping(await self._ws.send("ping"))
            except t.SOCKET_FAILED:
                log.debug("Home Assistant WebSocket was closed while idle; reconnecting")
                await self._ws_drop()
        if self._ws is None:
            ws = await t.new_socket(self.ws_url, self._token)
            self._ws = ws
            if self._ws_closer is not None:
                self._ws_closer.cancel()  # it watched the previous socket
            self._ws_closer = asyncio.create_task(self._close_when_idle(ws), name="ha:ws-idle-close")
            self._up()
        self._ws_used_at = time.monotonic()
        return self._ws

    async def _close_when_idle(self, ws: AsyncWebsocketClient) -> None:
        while self._ws is ws:
            idle = time.monotonic() - self._ws_used_at
            if idle < WS_IDLE_CLOSE_SECONDS or self._ws_lock.locked():
                await asyncio.sleep(max(0.25, WS_IDLE_CLOSE_SECONDS - idle))
                continue
            async with self._ws_lock:
                if self._ws is ws and time.monotonic() - self._ws_used_at >= WS_IDLE_CLOSE_SECONDS:
                    await self._ws_drop()

    async def _ws_drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            from farmhost.farm.homeassistant import transport as ha_transport

            await ha_transport.close_socket(ws)

    # link state ----------------------------------------------------------------------------------------

    def _lost(self, reason: str) -> NoReturn:
        self._running_confirmed = False
        if self._link is not _Link.DOWN:
            log.warning(
                "Home Assistant at %s is unreachable (%s); farm actions fail until it is back", self.url, reason
            )
            self._link = _Link.DOWN
        raise HaUnavailable(f"Home Assistant at {self.url} is unreachable ({reason}); try again later")

    def _auth_failed(self) -> NoReturn:
        if self._link is not _Link.AUTH_FAILED:
            log.error("Home Assistant at %s refused farmhost's token (HA_TOKEN); the operator must renew it", self.url)
            self._link = _Link.AUTH_FAILED
        raise HaAuthFailed(
            "Home Assistant refused the host's access token; the operator must set a valid HA_TOKEN "
            "(a long-lived access token) and restart farmhost"
        )

    def _up(self) -> None:
        if self._link is not _Link.UP:
            if self._link is not _Link.UNKNOWN:
                log.warning("Home Assistant at %s is reachable again", self.url)
            else:
                log.info("Home Assistant at %s is reachable", self.url)
            self._link = _Link.UP
