"""A rotating NDJSON log: one JSON line per record, rotated by size (the request log and the farm audit log)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

REQUEST_LOG_FILE = "requests.ndjson"
_BACKUPS = 5
logger = logging.getLogger(__name__)
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class NdjsonLog:
    """Appends one JSON object per line (the request log: `{ts, group, queue, requestId, type, status, ...}`).

    Each record is one `write` of its whole line to a descriptor opened for appending: a line is never split or
    interleaved with another writer's, and nothing is buffered, so a kill -9 loses no record already written.
    When the next line would take the file to `max_bytes`, it is rotated first: `<name>.1` .. `<name>.5`, the
    oldest dropped (the names `logging.handlers.RotatingFileHandler` uses).
    """

    def __init__(self, logs_dir: Path, *, max_bytes: int, file_name: str = REQUEST_LOG_FILE) -> None:
        # `file_name`: the same rotating NDJSON log serves farm-state/audit.ndjson (farmhost/farm/audit.py).
        logs_dir.mkdir(parents=True, exist_ok=True)
        self._path = logs_dir / file_name
        self._max_bytes = max_bytes
        self._lock = threading.Lock()  # the audit log is also written from handler threads
        self._fd: int | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self._path, _FLAGS, 0o644)
        self._size = os.fstat(self._fd).st_size

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        # A file name that is not UTF-8 (an agent's choice) is logged escaped rather than lost.
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
            "utf-8", "backslashreplace"
        )
        with self._lock:
            try:
                full = 0 < self._max_bytes <= self._size + len(line)
                if self._fd is not None and full and self._size > 0:
                    self._rotate()
                if self._fd is None:
                    self._open()  # closed by a rotation that failed half-way, or by `close`
                assert self._fd is not None
                self._size += os.write(self._fd, line)
            except OSError as err:
                # A full disk must not fail the request the line describes (as a logging handler would not).
                logger.error("cannot write %s: %s", self._path, err)

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        base = str(self._path)
        for index in range(_BACKUPS - 1, 0, -1):
            source = f"{base}.{index}"
            if os.path.exists(source):
                os.replace(source, f"{base}.{index + 1}")
        if os.path.exists(base):
            os.replace(base, f"{base}.1")
        self._open()

    def close(self) -> None:
        """Close the file (a later record opens it again)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
