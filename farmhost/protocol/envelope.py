"""The result envelope written to `action_results/<requestId>.json` for every request."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from farmhost.protocol.codes import ErrorCode, Status


def utc_stamp(moment: datetime) -> str:
    """Format an aware datetime as the contract's UTC timestamp (`2026-05-17T00:00:10.123Z`)."""
    # isoformat, not strftime: the same text (milliseconds truncated), at a tenth of the cost, twice per request.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a handler produced: a result, or an error sentence with its code."""

    result: Any = None
    error: str | None = None
    error_code: ErrorCode | None = None

    @property
    def ok(self) -> bool:
        """True when the request succeeded."""
        return self.error_code is None

    @classmethod
    def failure(cls, code: ErrorCode, message: str, result: Any = None) -> Outcome:
        """An error outcome (with a result only for the codes that carry one, such as pending_approval)."""
        return cls(error=message, error_code=code, result=result)


def envelope(
    *, request_id: str, kind: str, action: str | None, outcome: Outcome, executed_at: datetime, duration_ms: int
) -> dict[str, Any]:
    """Build the result document exactly as the contract lays it out."""
    return {
        "requestId": request_id,
        "type": kind,
        "action": action,
        "status": Status.SUCCESS.value if outcome.ok else Status.ERROR.value,
        # An error carries a result only where the contract gives it one (pending_approval: the approval's id).
        "result": outcome.result,
        "error": outcome.error,
        "errorCode": outcome.error_code.value if outcome.error_code else None,
        "executedAt": utc_stamp(executed_at),
        "durationMs": duration_ms,
    }
