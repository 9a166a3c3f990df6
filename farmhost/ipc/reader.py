"""Claiming a request file into the host's spool and reading it safely through its descriptor."""

from __future__ import annotations

import os
import stat
from typing import Final

from farmhost.protocol.codes import ErrorCode

_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """A claimed entry that must be quarantined unread (or unparsed)."""

    def __init__(self, reason: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def is_request_name(name: str) -> bool:
    """Only `*.json` names not starting with '.' are requests; everything else is a writer's temp file."""
    return name.endswith(".json") and not name.startswith(".") and len(name) > len(".json")


def pending_names(queue_fd: int) -> list[str]:
    """Request file names waiting in a queue directory, in processing (file-name) order."""
    return sorted(name for name in os.listdir(queue_fd) if is_request_name(name))


def claim(queue_fd: int, name: str, spool_fd: int) -> bool:
    """Move a request into the spool, where the agent can no longer touch it.

    rename() moves the directory entry itself, so a symlink stays a symlink, a FIFO stays a FIFO;
    nothing is opened here. Returns False when the file vanished first.
    """
    try:
        os.rename(name, name, src_dir_fd=queue_fd, dst_dir_fd=spool_fd)
    except FileNotFoundError:
        return False
    return True


def read_claimed(
    spool_fd: int, name: str, *, max_bytes: int, seen: os.stat_result | None = None
) -> tuple[bytes, os.stat_result]:
    """Read a claimed request, refusing anything but a small regular file with one link.

    Args:
        spool_fd: the spool holding the claimed file.
        name: its name there.
        max_bytes: the largest request read.
        seen: the entry's `lstat`, if the caller took it already (the spool is the host's: it cannot change).

    Returns:
        The bytes and the open file's `fstat` (its inode and modification time identify it: `file_key`).

    Raises:
        Refused: with the reason to record in quarantine.
    """
    info = seen or os.stat(name, dir_fd=spool_fd, follow_symlinks=False)
    kind = _kind_problem(info.st_mode)
    if kind:
        raise Refused(f"request file is {kind}; only regular files are read")
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=spool_fd)
    except OSError as err:
        raise Refused(f"request file could not be opened safely ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        kind = _kind_problem(info.st_mode)
        if kind:
            raise Refused(f"request file is {kind}; only regular files are read")
        if info.st_nlink != 1:
            raise Refused(f"request file has {info.st_nlink} hard links; write a new file instead of linking one")
        if info.st_size > max_bytes:
            raise Refused(f"request file is {info.st_size} bytes, over the {max_bytes}-byte limit")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise Refused(f"request file grew past the {max_bytes}-byte limit while being read")
        return data, info
    finally:
        os.close(fd)


def _kind_problem(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"
