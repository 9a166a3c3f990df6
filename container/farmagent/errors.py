"""Exceptions of farmagent: one root, each with the `code` a tool result reports to the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from farmagent.ipc.results import IpcResult


class FarmagentError(Exception):
    """Root of every farmagent error; `code` is a short stable word, `message` a sentence an agent can act on."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RequestError(FarmagentError):
    """The host answered `status: "error"`; `code` is the result's `errorCode` (wire.ErrorCode)."""

    def __init__(self, result: IpcResult) -> None:
        super().__init__(result.error or f"the host refused the request ({result.error_code})")
        self.code = result.error_code or "internal"
        self.request_id = result.request_id
        self.result = result

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidRequestError(FarmagentError, ValueError):
    """The client refuses to write a request the host would refuse (bad requestId, bad tool arguments)."""

    code = "invalid_request"


class NotAllowedError(FarmagentError):
    """A local tool refuses for good: a path outside what it may touch, a symlink, a file over its size limit."""

    code = "not_allowed"


class NotFoundError(FarmagentError):
    """A local tool found nothing where it looked (e.g. a farm-state file the host has not written yet)."""

    code = "not_found"


class HostUnavailableError(FarmagentError):
    """`host_status.json` says the host stopped, its heartbeat is stale, or no host ever served this group."""

    code = "host_unavailable"


class NoResultError(FarmagentError):
    """No result arrived before the deadline; `withdrawn` tells whether the request was taken back unexecuted."""

    code = "timeout"

    def __init__(self, message: str, *, request_id: str, withdrawn: bool) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.withdrawn = withdrawn


class ProtocolError(FarmagentError):
    """A result or snapshot file is not what the contract says (not a regular file, too big, not the JSON shape)."""

    code = "protocol_error"


class LlmError(FarmagentError):
    """The chat-completions endpoint failed (unreachable, 5xx after retries, refused the request)."""

    code = "llm_error"


class ConfigError(FarmagentError, ValueError):
    """A FARMAGENT_* environment variable has a value farmagent cannot use."""

    code = "config_error"
