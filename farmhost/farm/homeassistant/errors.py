"""The typed Home Assistant errors, each with the IPC error code the agent sees, and the mapping into them."""

from __future__ import annotations

import json
import re
from typing import Final

from farmhost.errors import FarmhostError
from farmhost.protocol.codes import ErrorCode

WS_ERROR_RE: Final = re.compile(r"^\[(?P<code>[a-z_]+)\] (?P<message>.*)$", re.DOTALL)


class HaError(FarmhostError):
    """Home Assistant answered with a server error (5xx) or something farmhost cannot read."""

    code = ErrorCode.UPSTREAM_ERROR


class HaUnavailable(HaError):
    """Home Assistant cannot be reached (refused, DNS) or is not RUNNING yet."""

    code = ErrorCode.UPSTREAM_UNAVAILABLE


class HaTimeout(HaError):
    """Home Assistant did not answer within the call's timeout."""

    code = ErrorCode.TIMEOUT


class HaAuthFailed(HaError):
    """Home Assistant refused the token (401, or WebSocket auth_invalid)."""

    code = ErrorCode.UPSTREAM_ERROR


class HaRejected(HaError):
    """Home Assistant refused the request (4xx other than 401/404); the message is HA's."""

    code = ErrorCode.UPSTREAM_ERROR


class HaNotFound(HaError):
    """Home Assistant does not know the entity (404), or the service/dashboard a command names."""

    code = ErrorCode.NOT_FOUND


def ws_error(text: str, what: str) -> HaError:
    """The typed error for HA's refusal `[code] message` (as the library words it) of a command about `what`."""
    match = WS_ERROR_RE.match(text)
    code, message = (match["code"], match["message"]) if match else ("unknown_error", text)
    text = f"Home Assistant refused {what}: {message} ({code})"
    if code in {"not_found", "config_not_found"}:
        return HaNotFound(text)
    if code == "unauthorized":
        return HaAuthFailed(f"Home Assistant refused {what} for farmhost's token: {message}")
    if code in {"home_assistant_error", "unknown_error", "timeout"}:
        return HaError(text)
    return HaRejected(text)


def ha_message(body: str) -> str:
    """HA's error text: the `message` of a JSON body, else the plain body, trimmed."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])[:500]
    return body.strip()[:500] or "no details"


def transport_reason(err: BaseException) -> str:
    """A few words on why a connection failed (refused, name not resolved, closed...), for the agent."""
    text = str(err)
    if "Errno 111" in text or "Connection refused" in text or "Connect call failed" in text:
        return "connection refused"
    if "resolve" in text or "Name or service not known" in text:
        return "host name not resolved"
    if "closed" in text.lower() or isinstance(err, ConnectionError):
        return "connection closed"
    return type(err).__name__
