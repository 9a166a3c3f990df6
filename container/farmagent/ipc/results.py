"""The result envelope the host writes to `action_results/<requestId>.json`, parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farmagent.errors import ProtocolError, RequestError
from farmagent.wire import ErrorCode


@dataclass(frozen=True, kw_only=True)
class IpcResult:
    """One result envelope (docs/ipc.md "The result")."""

    request_id: str
    type: str
    action: str | None
    status: str
    result: Any
    error: str | None
    error_code: str | None
    executed_at: str
    duration_ms: int

    @property
    def ok(self) -> bool:
        """Whether the host says `success`."""
        return self.status == "success"

    def unwrap(self) -> Any:
        """The `result` of a success.

        Raises:
            RequestError: the host answered `status: "error"` (its `code` is the result's `errorCode`).
        """
        if not self.ok:
            raise RequestError(self)
        return self.result

    def to_dict(self) -> dict[str, Any]:
        """The envelope in its wire form."""
        return {
            "requestId": self.request_id,
            "type": self.type,
            "action": self.action,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "errorCode": self.error_code,
            "executedAt": self.executed_at,
            "durationMs": self.duration_ms,
        }


_CODES = frozenset(code.value for code in ErrorCode)


def parse_result(document: Any, *, request_id: str) -> IpcResult:
    """Check a parsed result file against the envelope and the request it answers.

    Raises:
        ProtocolError: a field is missing or of the wrong type, or the result answers another request.
    """
    if not isinstance(document, dict):
        raise ProtocolError(f"the result of {request_id} is not a JSON object")
    status = document.get("status")
    code = document.get("errorCode")
    checks = (
        (document.get("requestId") == request_id, f"answers requestId {document.get('requestId')!r}"),
        (status in ("success", "error"), f"has status {status!r}"),
        (isinstance(document.get("type"), str), "has no type"),
        (document.get("action") is None or isinstance(document.get("action"), str), "has a non-text action"),
        (document.get("error") is None or isinstance(document.get("error"), str), "has a non-text error"),
        (code is None or code in _CODES, f"has the unknown errorCode {code!r}"),
        (status != "error" or code is not None, "is an error without errorCode"),
    )
    for passed, problem in checks:
        if not passed:
            raise ProtocolError(f"the result of {request_id} {problem}")
    duration = document.get("durationMs")
    return IpcResult(
        request_id=request_id,
        type=document["type"],
        action=document.get("action"),
        status=str(status),
        result=document.get("result"),
        error=document.get("error"),
        error_code=code,
        executed_at=str(document.get("executedAt", "")),
        duration_ms=duration if isinstance(duration, int) and not isinstance(duration, bool) else 0,
    )
