"""What goes wrong with the local Home Assistant: it could not be set up, or it answered a call with an error."""

from __future__ import annotations


class HaSetupError(RuntimeError):
    """Home Assistant could not be installed or started; the message says why and what to do."""


class HaHttpError(RuntimeError):
    """HA answered a REST call with an error status."""

    def __init__(self, status: int, body: str, path: str) -> None:
        super().__init__(f"HA {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body
