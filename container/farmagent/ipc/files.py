"""File primitives of the IPC client: the atomic request write and the link-free, size-capped JSON read."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Final

from farmagent.errors import ProtocolError

_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def temp_name(final_name: str) -> str:
    """The name a request is written under before the rename: the host skips names starting with '.'."""
    return f".{final_name}.{secrets.token_hex(4)}.tmp"


def write_atomic(directory: Path, name: str, data: bytes) -> None:
    """Write `directory/name` so that a reader sees nothing or the complete file, never a part of it.

    The bytes go to an O_EXCL temporary name the host ignores and are then renamed to `name` in the same
    directory (rename is atomic within one filesystem), as SPEC section 4 asks of a writer. There is no fsync:
    a running host reads the page cache, so a request is complete the moment it is renamed; only a power loss
    can leave it empty, and then the run that wrote it is gone too, the host quarantines the empty file and
    executes nothing. Durability is the host's side (the claim, the ledger, the fsynced result).

    Raises:
        OSError: the directory is missing or not writable (the temporary file is removed).
    """
    tmp = directory / temp_name(name)
    fd = os.open(tmp, _CREATE_FLAGS, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.rename(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(directory: Path, name: str, *, max_bytes: int) -> Any | None:
    """Parse `directory/name` without following links; None when it does not exist.

    Raises:
        ProtocolError: the entry is a link, not a regular file, larger than `max_bytes` or not JSON.
    """
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ProtocolError(f"{directory} cannot be opened as a directory ({err.strerror})") from None
    try:
        data = _read_in(dir_fd, name, max_bytes=max_bytes, where=directory / name)
    finally:
        os.close(dir_fd)
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"{directory / name} is not valid JSON ({err})") from None


def _read_in(dir_fd: int, name: str, *, max_bytes: int, where: Path) -> bytes | None:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:  # ELOOP: a symlink where a host-written file belongs
        raise ProtocolError(f"{where} cannot be read safely ({err.strerror}); only regular files are read") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ProtocolError(f"{where} is not a regular file")
        if info.st_size > max_bytes:
            raise ProtocolError(f"{where} is {info.st_size} bytes, over the {max_bytes}-byte limit")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise ProtocolError(f"{where} grew over the {max_bytes}-byte limit while being read")
    return data


def remove(path: Path) -> bool:
    """Unlink `path` (a link is removed, never followed); returns whether there was something to remove."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
