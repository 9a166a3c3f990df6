"""The glue to homeassistant-api and niquests under HAClient: sessions, sockets, and what they raise.

Imported by HAClient when it starts, not when farmhost starts: niquests (urllib3-future, qh3, jh2...) and
homeassistant-api's pydantic models take 0.3-1 s to import, which every CLI command would otherwise pay.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any, Final

import niquests
from homeassistant_api import AsyncClient, AsyncWebsocketClient
from homeassistant_api.errors import HomeassistantAPIError, ResponseError, UnauthorizedError
from homeassistant_api.processing import async_process_response

from farmhost.farm.homeassistant.errors import ha_message

log = logging.getLogger(__name__)

# What the layers below raise, sorted by what it means for HAClient.
TIMEOUTS: Final = (TimeoutError, niquests.exceptions.Timeout)
CONNECT_TIMEOUT: Final = niquests.exceptions.ConnectTimeout
REQUEST_FAILED: Final = niquests.exceptions.RequestException  # refused, DNS, reset: no usable answer
UNREADABLE: Final = HomeassistantAPIError  # an answer the library could not parse
SOCKET_FAILED: Final = (niquests.exceptions.RequestException, OSError, HomeassistantAPIError)
WsRefusal = ResponseError  # HA answered a WebSocket command with success: false ("[code] message")
AuthRefused = UnauthorizedError  # WebSocket auth_invalid

__all__ = [
    "AsyncWebsocketClient",
    "AuthRefused",
    "HttpStatusError",
    "RestClient",
    "WsRefusal",
    "close_socket",
    "new_rest_client",
    "new_socket",
]


class HttpStatusError(Exception):
    """A non-2xx answer, raised from inside the library's response processing with HA's own text."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class RestClient(AsyncClient):
    """The library's REST client, with the status check replaced so that HA's status and message survive."""

    @staticmethod
    async def response_logic(response: niquests.Response) -> Any:
        """Raise HttpStatusError for 4xx/5xx; otherwise let the library decode the body."""
        status = response.status_code or 0
        if status >= HTTPStatus.BAD_REQUEST:
            raise HttpStatusError(status, ha_message(response.text or ""))
        return await async_process_response(response)

    async def aclose(self) -> None:
        """Close the HTTP session and its pooled connections."""
        await self._session.close()


def new_rest_client(url: str, token: str) -> RestClient:
    """A REST client for `<url>/api/` on its own session: no retries (HAClient decides), no HTTP/3 probing."""
    # The library logs every WebSocket message at INFO; farmhost logs HA's link changes itself.
    logging.getLogger("homeassistant_api").setLevel(logging.WARNING)
    return RestClient(f"{url}/api/", token, session=niquests.AsyncSession(retries=0, disable_http3=True))


class _Socket(AsyncWebsocketClient):
    """The library's WebSocket client, reading HA's refusals itself.

    The library validates a refusal against a model whose translation placeholders must all be strings; HA sends
    numbers there (`number.set_value` out of range: `"value": -5.0`), and the refusal became a pydantic
    ValidationError that no caller expects instead of HA's own sentence.
    """

    def parse_response(self, data: dict[str, Any]) -> None:
        """A refusal raises ResponseError `[code] message`, as the library words it; anything else is the library's."""
        if data.get("type") == "result" and not data.get("success"):
            error = data.get("error")
            error = error if isinstance(error, dict) else {}
            raise ResponseError(f"[{error.get('code', 'unknown_error')}] {error.get('message', 'no details')}")
        super().parse_response(data)


async def new_socket(ws_url: str, token: str) -> AsyncWebsocketClient:
    """An open, authenticated WebSocket (raises what the library raises; a half-open socket is closed)."""
    ws = _Socket(ws_url, token, session=niquests.AsyncSession(retries=0))
    try:
        await ws.__aenter__()
    except BaseException:
        await close_socket(ws)
        raise
    return ws


async def close_socket(ws: AsyncWebsocketClient) -> None:
    """Close a socket that may be half open (auth refused, HA hung); errors do not matter any more.

    The extension's close sends a close frame without waiting for HA's, so a hung HA cannot hold it up; the
    library's own `__aexit__` is not used because it fails on a socket whose handshake never finished.
    """
    try:
        async with asyncio.timeout(1.0):
            extension = getattr(ws, "_ws", None)
            if extension is not None:
                await extension.close()
            await ws._session.close()
    except Exception as err:  # noqa: BLE001 - closing a dead socket: nothing useful to do with the error
        log.debug("closing the Home Assistant WebSocket: %s", err)
