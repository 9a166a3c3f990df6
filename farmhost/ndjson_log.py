"""A rotating NDJSON log: one JSON line per record, rotated by size (the request log and the farm audit log)."""

from __future__ import annotations

import json
import logging
import logging.handlers
from pathlib import Path
from typing import Any

REQUEST_LOG_FILE = "requests.ndjson"
_BACKUPS = 5


class NdjsonLog:
    """Appends one JSON object per line (the request log: `{ts, group, queue, requestId, type, status, ...}`)."""

    def __init__(self, logs_dir: Path, *, max_bytes: int, file_name: str = REQUEST_LOG_FILE) -> None:
        # `file_name`: the same rotating NDJSON log serves farm-state/audit.ndjson (farmhost/farm/audit.py).
        logs_dir.mkdir(parents=True, exist_ok=True)
        self._handler = logging.handlers.RotatingFileHandler(
            # A file name that is not UTF-8 (an agent's choice) is logged escaped rather than lost.
            logs_dir / file_name,
            maxBytes=max_bytes,
            backupCount=_BACKUPS,
            encoding="utf-8",
            errors="backslashreplace",
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger = logging.getLogger(f"farmhost.requests.{id(self)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self._handler)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self._logger.info(json.dumps(record, ensure_ascii=False, separators=(",", ":")))

    def close(self) -> None:
        """Flush and close the file."""
        self._logger.removeHandler(self._handler)
        self._handler.close()
