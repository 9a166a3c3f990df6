"""Quarantine: refused request files go to `ipc/errors/<folder>/` with a `.reason.json`, never overwriting, capped.

The note is the SPEC's six fields (`folder, queue, file, reason, errorCode, receivedAt`); when an entry is not kept
whole its `reason` ends in "; kept: ..." saying what is, and so does the log line.

What the host keeps for a group is bounded, whatever the group sends: a refused file over KEEP_BYTES is kept as its
first KEEP_BYTES (the note says how long it was), and each group's quarantine holds at most MAX_ENTRIES entries and
MAX_BYTES of their content. The first ones are kept, being the evidence of how an attack began: past the byte cap a
new entry is kept as its reason only, past the entry cap not at all (its log line is the whole record). Deleting
files from `ipc/errors/<folder>/` (or the retention sweep) makes room again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from farmhost.files import DIR_FLAGS, discard, dump_json, prepare_atomic
from farmhost.ipc.renames import rename_noreplace
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import utc_stamp

logger = logging.getLogger(__name__)

# Keep quarantine names under NAME_MAX (255 bytes, not characters) with room for a counter and ".reason.json".
_MAX_NAME_BYTES = 160
# An agent that re-plants a link as fast as the host removes it gets this many rounds, then its entry stays here.
_PUT_BACK_ATTEMPTS = 8
_REPLANTED = "planted again while the host put back the directory it caught by mistake"
# What of a refused file is kept: enough to see what an agent sent (a request is at most FARMHOST_IPC_MAX_REQUEST_BYTES,
# 1 MiB by default; an oversized one may be hundreds of MB), little enough that MAX_ENTRIES of them fit in MAX_BYTES.
KEEP_BYTES: Final = 64 * 1024
# Entries (each with its note) one group's quarantine holds by default (FARMHOST_QUARANTINE_MAX_FILES): a day of
# refusals from a misbehaving agent, and few enough that counting them at start costs nothing.
MAX_ENTRIES: Final = 1000
# Bytes of kept content per group by default (FARMHOST_QUARANTINE_MAX_MB): 512 cut requests; with MAX_ENTRIES notes
# (under 1 KiB each) at most ~33 MiB.
MAX_BYTES: Final = 32 * 1024 * 1024
NOTE_SUFFIX: Final = ".reason.json"
# What `_keep` says of an entry kept as it came: the normal case, which the reason does not mention.
_WHOLE: Final = "whole"
# Where a refused directory too big to keep goes, in `ipc/errors/`, to be emptied off the event loop (the service's
# trash drain): an agent can fill a directory in its queue with a million files, and the host moves it in one rename.
TRASH: Final = ".trash"


@dataclass(kw_only=True)
class _Held:
    """What one group's quarantine holds (counted once from disk, then kept up to date)."""

    entries: int
    bytes: int
    full_logged: bool = False


class Quarantine:
    """Moves bad entries into `ipc/errors/<folder>/`; the agent's own directories never hold them."""

    def __init__(
        self,
        errors_fd: int,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        on_trash: Callable[[], None] = lambda: None,
    ) -> None:
        """Quarantine into `errors_fd`; `on_trash` is called when a directory was put in TRASH to be emptied."""
        self._errors_fd = errors_fd
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._on_trash = on_trash
        self._held: dict[str, _Held] = {}

    def recount(self) -> None:
        """Count again from disk at the next use (after a sweep, or files deleted by hand)."""
        self._held.clear()

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
            held = self._count(dir_fd, folder)  # before the move, which it must not count
            target = self._target(dir_fd, queue, original_name, at)
            os.rename(src_name, target, src_dir_fd=src_dir_fd, dst_dir_fd=dir_fd)
            kept = self._keep(dir_fd, target, folder, held)
            if kept is not None:
                self._write_note(dir_fd, target, folder, queue, original_name, _said(reason, kept), code, at)
        finally:
            os.close(dir_fd)
        self._log(folder, queue, original_name, reason, code, request_id, kept=kept)
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
            held = self._count(errors_fd, folder)
            target = self._target(errors_fd, queue, name, at)
            try:
                os.rename(name, target, src_dir_fd=dir_fd, dst_dir_fd=errors_fd)
            except FileNotFoundError:
                return False  # the agent removed it first
            moved = os.stat(target, dir_fd=errors_fd, follow_symlinks=False)
            if (moved.st_dev, moved.st_ino) != (seen.st_dev, seen.st_ino):
                self._put_back(errors_fd, target, moved, dir_fd, name, folder=folder, queue=queue, at=at)
                return False
            kept = self._keep(errors_fd, target, folder, held)
            if kept is not None:
                code = ErrorCode.INVALID_REQUEST
                self._write_note(errors_fd, target, folder, queue, name, _said(reason, kept), code, at)
        finally:
            os.close(errors_fd)
        self._log(folder, queue, name, reason, ErrorCode.INVALID_REQUEST, None, kept=kept)
        return True

    def _keep(self, dir_fd: int, target: str, folder: str, held: _Held) -> str | None:
        """Fit the entry just moved to `target` into the group's caps; what was kept (_WHOLE, a phrase, None: nothing).

        A regular file over KEEP_BYTES is replaced by a copy of its first KEEP_BYTES (a new file: the agent may
        hold a link to the one it sent). A directory is kept whole if its entries fit in what the caps leave (they
        are counted up to that, no further), else it goes to TRASH and only its reason is kept.
        """
        if held.entries >= self._max_entries:
            self._drop(dir_fd, target)
            self._full(folder, held)
            return None
        info = os.stat(target, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            room = self._max_entries - held.entries - 1
            inside = count_entries(dir_fd, target, up_to=room)
            if inside > room:
                self._to_trash(dir_fd, target)
                held.entries += 1
                return (
                    f"this note only (a directory of more than {room} entries, more than {folder}'s quarantine holds)"
                )
            held.entries += 1 + inside
            return _WHOLE
        held.entries += 1
        size = info.st_size if stat.S_ISREG(info.st_mode) else 0
        kept_size = min(size, KEEP_BYTES)
        if held.bytes + kept_size > self._max_bytes:
            self._drop(dir_fd, target)
            self._full(folder, held)
            return f"this note only ({folder}'s quarantine holds its limit of {self._max_bytes} bytes)"
        held.bytes += kept_size
        if size <= KEEP_BYTES:
            return _WHOLE
        self._cut(dir_fd, target)
        return f"the first {KEEP_BYTES} of {size} bytes"

    def _to_trash(self, dir_fd: int, target: str) -> None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(TRASH, 0o700, dir_fd=self._errors_fd)
        trash_fd = os.open(TRASH, DIR_FLAGS, dir_fd=self._errors_fd)
        try:
            os.rename(target, self._free_name(trash_fd, target), src_dir_fd=dir_fd, dst_dir_fd=trash_fd)
        finally:
            os.close(trash_fd)
        self._on_trash()

    def _count(self, dir_fd: int, folder: str) -> _Held:
        held = self._held.get(folder)
        if held is None:
            entries = size = 0
            for name in os.listdir(dir_fd):
                if name.endswith(NOTE_SUFFIX):
                    continue
                entries += 1
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    size += info.st_size if stat.S_ISREG(info.st_mode) else 0
                    if stat.S_ISDIR(info.st_mode):
                        entries += count_entries(dir_fd, name, up_to=self._max_entries)
            held = self._held[folder] = _Held(entries=entries, bytes=size)
        return held

    def _full(self, folder: str, held: _Held) -> None:
        if not held.full_logged:
            held.full_logged = True
            logger.warning(
                "group %s: its quarantine is full (%d entries, %d bytes kept, caps %d and %d); later refused files "
                "are logged but not kept; delete files from ipc/errors/%s/ to keep them again",
                folder,
                held.entries,
                held.bytes,
                self._max_entries,
                self._max_bytes,
                folder,
                extra={"group": folder},
            )

    @staticmethod
    def _drop(dir_fd: int, target: str) -> None:
        """Remove what was just moved in (a directory, which the host itself made, stays)."""
        with contextlib.suppress(IsADirectoryError, PermissionError, FileNotFoundError):
            os.unlink(target, dir_fd=dir_fd)

    @staticmethod
    def _cut(dir_fd: int, target: str) -> None:
        """Replace `target` by a new file holding its first KEEP_BYTES."""
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            head = os.pread(fd, KEEP_BYTES, 0)
        finally:
            os.close(fd)
        part = f"{target}.part"
        out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        with os.fdopen(out, "wb") as handle:
            handle.write(head)
        os.rename(part, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

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
        # Whole under its name or not there (a reader never opens it empty), and never in place of another file.
        tmp = prepare_atomic(dir_fd, f"{target}{NOTE_SUFFIX}", dump_json(note), durable=False)
        try:
            rename_noreplace(dir_fd, tmp, dir_fd, f"{target}{NOTE_SUFFIX}")
        except BaseException:
            discard(dir_fd, tmp)
            raise

    @staticmethod
    def _log(
        folder: str, queue: str, name: str, reason: str, code: ErrorCode, request_id: str | None, *, kept: str | None
    ) -> None:
        logger.warning(
            "quarantined %s/%s/%s: %s",
            folder,
            queue,
            name,
            _said(reason, kept or "nothing, the quarantine is full"),
            extra={"group": folder, "queue": queue, "requestId": request_id, "errorCode": code.value},
        )

    def _folder_fd(self, folder: str) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755, dir_fd=self._errors_fd)
        return os.open(folder, DIR_FLAGS, dir_fd=self._errors_fd)

    @staticmethod
    def _free_name(dir_fd: int, wanted: str) -> str:
        candidate, counter = wanted, 1
        while _exists(dir_fd, candidate) or _exists(dir_fd, f"{candidate}{NOTE_SUFFIX}"):
            counter += 1
            candidate = f"{wanted}-{counter}"
        return candidate


def count_entries(parent_fd: int, name: str, *, up_to: int) -> int:
    """The entries in the tree of directory `name` (by descriptor, no link followed), counted up to `up_to` + 1."""
    count = 0
    try:
        stack = [os.open(name, DIR_FLAGS, dir_fd=parent_fd)]
    except OSError:
        return 0
    try:
        while stack and count <= up_to:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        count += 1
                        if count > up_to:
                            break
                        if entry.is_dir(follow_symlinks=False):
                            with contextlib.suppress(OSError):
                                stack.append(os.open(entry.name, DIR_FLAGS, dir_fd=fd))
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return count


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


def _said(reason: str, kept: str) -> str:
    """The reason as the note and the log give it: with what was kept of the entry, unless it was kept whole."""
    return reason if kept == _WHOLE else f"{reason}; kept: {kept}"
