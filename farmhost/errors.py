"""The error hierarchy shared by every farmhost service, each mapped to one IPC error code."""

from __future__ import annotations

from farmhost.protocol.codes import ErrorCode


class FarmhostError(Exception):
    """Root of farmhost's errors; `code` is what the agent sees in its result."""

    code: ErrorCode = ErrorCode.INTERNAL
    result: object = None  # what the error result carries besides the sentence (pending_approval: the approval)

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidRequest(FarmhostError):
    """The request is well-formed JSON but asks for something impossible or malformed."""

    code = ErrorCode.INVALID_REQUEST


class Unauthorized(FarmhostError):
    """The source group may not do this."""

    code = ErrorCode.UNAUTHORIZED


class NotFound(FarmhostError):
    """The thing the request names does not exist."""

    code = ErrorCode.NOT_FOUND


class NotAllowed(FarmhostError):
    """A policy forbids this, whoever asks."""

    code = ErrorCode.NOT_ALLOWED


class Conflict(FarmhostError):
    """The request clashes with existing state (a duplicate id, a taken folder)."""

    code = ErrorCode.CONFLICT


class Unavailable(FarmhostError):
    """A part of the appliance the request needs is switched off or unreachable."""

    code = ErrorCode.UPSTREAM_UNAVAILABLE


class RateLimited(FarmhostError):
    """The group asked for more than its share (of the outbox, of actuator time); it may try again later."""

    code = ErrorCode.RATE_LIMITED


class PendingApproval(FarmhostError):
    """A control action the farm profile puts under approval: asked in the chat, not executed (yet)."""

    code = ErrorCode.PENDING_APPROVAL

    def __init__(self, message: str, *, result: dict[str, object]) -> None:
        super().__init__(message)
        self.result = result


class ConfigError(FarmhostError):
    """The operator's configuration is wrong; the message names the setting."""
