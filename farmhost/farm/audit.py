"""The farm audit log: one NDJSON line per farm action, accepted or refused, in `farm-state/audit.ndjson`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from farmhost.handling import Approved
from farmhost.ndjson_log import NdjsonLog
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import utc_stamp

AUDIT_FILE: Final = "audit.ndjson"
REDACTED: Final = "[redacted]"
# Keys whose values are never written, at any depth: an agent may paste a credential into params by mistake.
SECRET_KEY_RE: Final = re.compile(
    r"token|passw|secret|api[_-]?key|apikey|authori[sz]ation|credential|cookie|private[_-]?key|bearer|session",
    re.IGNORECASE,
)
# A dashboard's YAML can be up to the 1 MiB request limit; the audit keeps the shape, not the bulk.
MAX_STRING_CHARS: Final = 500
MAX_ITEMS: Final = 50
MAX_DEPTH: Final = 6


class AuditLog:
    """Appends `{ts, group, requestId, action, params, status, errorCode, durationMs}`; rotates by size."""

    def __init__(self, farm_state_dir: Path, *, max_bytes: int) -> None:
        self.path = farm_state_dir / AUDIT_FILE
        self._dir = farm_state_dir
        self._max_bytes = max_bytes
        self._log: NdjsonLog | None = None  # opened at the first record: a handler table may never be used

    def record(
        self,
        *,
        at: datetime,
        group: str,
        request_id: str | None,
        action: str | None,
        params: Any,
        error_code: ErrorCode | None,
        duration_ms: int,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one line; `params` are redacted and trimmed first; `extra` adds keys (an approval's id, who)."""
        if self._log is None:
            self._log = NdjsonLog(self._dir, max_bytes=self._max_bytes, file_name=AUDIT_FILE)
        self._log.write(
            {
                "ts": utc_stamp(at),
                "group": group,
                "requestId": request_id,
                "action": action,
                "params": scrub(params),
                "status": "error" if error_code else "success",
                "errorCode": error_code.value if error_code else None,
                "durationMs": duration_ms,
                **(extra or {}),
            }
        )

    def close(self) -> None:
        """Flush and close the file (a later record opens it again)."""
        if self._log is not None:
            log, self._log = self._log, None
            log.close()


def approval_keys(approved: Approved | None) -> dict[str, str]:
    """The audit keys of a call run under an approval in the chat: `approvalId` and `approvedBy`."""
    return {} if approved is None else {"approvalId": approved.approval_id, "approvedBy": approved.by}


def scrub(value: Any, depth: int = 0) -> Any:
    """A copy of `value` safe to log: secret-looking keys redacted, long strings and lists trimmed."""
    if depth >= MAX_DEPTH:
        return "[...]"
    if isinstance(value, dict):
        items = list(value.items())
        out: dict[str, Any] = {
            str(key): REDACTED if SECRET_KEY_RE.search(str(key)) else scrub(item, depth + 1)
            for key, item in items[:MAX_ITEMS]
        }
        if len(items) > MAX_ITEMS:
            out["[more keys]"] = len(items) - MAX_ITEMS
        return out
    if isinstance(value, list):
        trimmed = [scrub(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            trimmed.append(f"[{len(value) - MAX_ITEMS} more]")
        return trimmed
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        return value[:MAX_STRING_CHARS] + f"...[{len(value)} chars]"
    return value
