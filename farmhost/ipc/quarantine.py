"""Quarantine: refused request files go to `ipc/errors/<folder>/` with a `.reason.json`, never overwriting."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from datetime import datetime

from farmhost.ipc.groupdir import DIR_FLAGS
from farmhost.ipc.renames import rename_noreplace
from farmhost.ipc.writer import dump_json
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import utc_stamp

logger = logging.getLogger(__name__)

# Keep quarantine names under NAME_MAX (255 bytes, not characters) with room for a counter and ".reason.json".
_MAX_NAME_BYTES = 160
# An agent that re-plants a link as fast as the host removes it gets this many rounds, then its entry stays here.
_PUT_BACK_ATTEMPTS = 8
_REPLANTED = "planted again while the host put back the directory it caught by mistake"


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

        For entries in the host's own spool, which no agent can touch. `request_id` (when the refused file
        named one) only goes into the log line.
        """
        dir_fd = self._folder_fd(folder)
        try:
            target = self._target(dir_fd, queue, original_name, at)
            os.rename(src_name, target, src_dir_fd=src_dir_fd, dst_dir_fd=dir_fd)
            self._write_note(dir_fd, target, folder, queue, original_name, reason, code, at)
        finally:
            os.close(dir_fd)
        self._log(folder, queue, original_name, reason, code, request_id)
        return target

    def evict(
        self, dir_fd: int, name: str, seen: os.stat_result, *, folder: str, queue: str, reason: str, at: datetime
    ) -> bool:
        """Move `name` out of an agent's directory, but only if it is still the entry `seen`.

        The agent can swap the entry between the host's look and its rename: whatever the rename caught is
        checked in quarantine (where the agent cannot reach) and put back, never kept, unless it is what was
        seen. Returns whether `seen` was moved.
        """
        errors_fd = self._folder_fd(folder)
        try:
            target = self._target(errors_fd, queue, name, at)
            try:
                os.rename(name, target, src_dir_fd=dir_fd, dst_dir_fd=errors_fd)
            except FileNotFoundError:
                return False  # the agent removed it first
            moved = os.stat(target, dir_fd=errors_fd, follow_symlinks=False)
            if (moved.st_dev, moved.st_ino) == (seen.st_dev, seen.st_ino):
                self._write_note(errors_fd, target, folder, queue, name, reason, ErrorCode.INVALID_REQUEST, at)
            else:
                self._put_back(errors_fd, target, moved, dir_fd, name, folder=folder, queue=queue, at=at)
                return False
        finally:
            os.close(errors_fd)
        self._log(folder, queue, name, reason, ErrorCode.INVALID_REQUEST, None)
        return True

    def _put_back(
        self,
        errors_fd: int,
        target: str,
        moved: os.stat_result,
        dir_fd: int,
        name: str,
        *,
        folder: str,
        queue: str,
        at: datetime,
    ) -> None:
        """Return an entry caught by mistake to `name`; if the agent planted something there again, that goes."""
        for _ in range(_PUT_BACK_ATTEMPTS):
            try:
                rename_noreplace(errors_fd, target, dir_fd, name)
                return
            except FileExistsError:
                pass
            try:
                occupant = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(occupant.st_mode) and stat.S_ISDIR(moved.st_mode):
                # The host (or the agent) made a fresh directory there: the caught one's entries join it.
                self._merge(errors_fd, target, dir_fd, name, folder=folder, queue=queue, at=at)
                return
            self.evict(dir_fd, name, occupant, folder=folder, queue=queue, reason=_REPLANTED, at=at)
        reason = f"{name} was caught while the agent swapped it and could not be put back; it is kept here"
        self._write_note(errors_fd, target, folder, queue, name, reason, ErrorCode.INTERNAL, at)
        logger.error("group %s: %s", folder, reason)

    def _merge(
        self, errors_fd: int, target: str, dir_fd: int, name: str, *, folder: str, queue: str, at: datetime
    ) -> None:
        src = os.open(target, DIR_FLAGS, dir_fd=errors_fd)
        try:
            dst = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            os.close(src)
            raise
        kept = 0
        try:
            for child in os.listdir(src):
                try:
                    rename_noreplace(src, child, dst, child)
                except OSError:
                    kept += 1
        finally:
            os.close(src)
            os.close(dst)
        if kept:
            reason = f"{kept} entries of {name}/ could not be put back next to newer ones of the same name"
            self._write_note(errors_fd, target, folder, queue, name, reason, ErrorCode.CONFLICT, at)
            return
        os.rmdir(target, dir_fd=errors_fd)

    def _target(self, dir_fd: int, queue: str, original_name: str, at: datetime) -> str:
        return self._free_name(dir_fd, _fit(f"{at.strftime('%Y%m%dT%H%M%S.%fZ')}-{queue}-{original_name}"))

    @staticmethod
    def _write_note(
        dir_fd: int,
        target: str,
        folder: str,
        queue: str,
        original_name: str,
        reason: str,
        code: ErrorCode,
        at: datetime,
    ) -> None:
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

    @staticmethod
    def _log(folder: str, queue: str, name: str, reason: str, code: ErrorCode, request_id: str | None) -> None:
        logger.warning(
            "quarantined %s/%s/%s: %s",
            folder,
            queue,
            name,
            reason,
            extra={"group": folder, "queue": queue, "requestId": request_id, "errorCode": code.value},
        )

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
