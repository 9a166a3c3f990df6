"""Quarantine: refused request files go to `ipc/errors/<folder>/` with a `.reason.json`, never overwriting."""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import datetime

from farmhost.ipc.groupdir import DIR_FLAGS
from farmhost.ipc.writer import dump_json
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import utc_stamp

logger = logging.getLogger(__name__)

# Keep quarantine names under NAME_MAX (255 bytes, not characters) with room for a counter and ".reason.json".
_MAX_NAME_BYTES = 160


class Quarantine:
    """Moves bad entries into `ipc/errors/<folder>/`; the agent's own directories never hold them."""

    def __init__(self, errors_fd: int) -> None:
        self._errors_fd = errors_fd

    def move(
        self,
        src_dir_fd: int,
        src_name: str,
        *,
        folder: str,
        queue: str,
        original_name: str,
        reason: str,
        code: ErrorCode,
        at: datetime,
        request_id: str | None = None,
    ) -> str:
        """Move `src_name` (any kind of entry) into quarantine and write its reason; returns the new name.

        `request_id` (when the refused file named one) only goes into the log line.
        """
        dir_fd = self._folder_fd(folder)
        try:
            target = self._free_name(dir_fd, _fit(f"{at.strftime('%Y%m%dT%H%M%S.%fZ')}-{queue}-{original_name}"))
            os.rename(src_name, target, src_dir_fd=src_dir_fd, dst_dir_fd=dir_fd)
            note = {
                "folder": folder,
                "queue": queue,
                "file": _printable(original_name),
                "reason": reason,
                "errorCode": code.value,
                "receivedAt": utc_stamp(at),
            }
            fd = os.open(
                f"{target}.reason.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
            )
            with os.fdopen(fd, "wb") as handle:
                handle.write(dump_json(note))
        finally:
            os.close(dir_fd)
        logger.warning(
            "quarantined %s/%s/%s: %s",
            folder,
            queue,
            original_name,
            reason,
            extra={"group": folder, "queue": queue, "requestId": request_id, "errorCode": code.value},
        )
        return target

    def _folder_fd(self, folder: str) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755, dir_fd=self._errors_fd)
        return os.open(folder, DIR_FLAGS, dir_fd=self._errors_fd)

    @staticmethod
    def _free_name(dir_fd: int, wanted: str) -> str:
        candidate, counter = wanted, 1
        while _exists(dir_fd, candidate) or _exists(dir_fd, f"{candidate}.reason.json"):
            counter += 1
            candidate = f"{wanted}-{counter}"
        return candidate


def _fit(name: str) -> str:
    """Cut a name to _MAX_NAME_BYTES; names from listdir may hold undecodable bytes (surrogate escapes)."""
    raw = os.fsencode(name)
    return name if len(raw) <= _MAX_NAME_BYTES else os.fsdecode(raw[:_MAX_NAME_BYTES])


def _printable(name: str) -> str:
    """A file name as JSON-safe text: bytes that are not UTF-8 become U+FFFD."""
    return os.fsencode(name).decode("utf-8", "replace")


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
