"""Writing a request the way an agent does and waiting for its result (used by `farmhost ipc send`)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as f

from farmhost.protocol.codes import REQUEST_ID_RE, RESULTS_DIR


def new_request_id() -> str:
    """A sortable, unique request id (also the file's name)."""
    return f"{time.time_ns()}-{secrets.token_hex(4)}"


def write_request(queue_dir: Path, payload: dict[str, Any]) -> str:
    """Write `payload` into a queue: O_EXCL temp file starting with '.', fsync, rename to `<requestId>.json`.

    Returns:
        The requestId (taken from the payload, or generated and added to it).
    """
    request_id = payload.setdefault("requestId", new_request_id())
    if not (isinstance(request_id, str) and REQUEST_ID_RE.fullmatch(request_id)):
        raise ValueError("requestId must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    name = f"{request_id}.json"
    tmp = queue_dir / f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(json.dumps(payload).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, queue_dir / name)
    return request_id


def wait_result(group_ipc: Path, request_id: str, *, timeout: float, remove: bool = True) -> dict[str, Any] | None:
    """Wait for `action_results/<requestId>.json`; returns the parsed result, or None after `timeout`."""
    results = group_ipc / RESULTS_DIR
    target = results / f"{request_id}.json"
    deadline = time.monotonic() + timeout
    with INotify() as inotify:
        inotify.add_watch(results, f.MOVED_TO | f.CLOSE_WRITE)
        while True:
            document = _read(target)
            if document is not None:
                if remove:
                    target.unlink(missing_ok=True)
                return document
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # Wake on any rename into the directory, and at least every 200 ms in case inotify missed it.
            inotify.read(timeout=int(min(left, 0.2) * 1000))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None
