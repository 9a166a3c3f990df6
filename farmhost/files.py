"""Files relative to held directory descriptors: the flags to open directories, atomic writes (temp, fsync, rename)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import Any, Final

# A directory opened to hold it: never through a link an agent could have put in its place.
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The same for a walk of an agent's tree: a FIFO or device swapped in for a directory must not block the open.
WALK_DIR_FLAGS: Final = DIR_FLAGS | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(
    dir_fd: int, name: str, data: bytes, *, fsync_dir: bool = False, mode: int = 0o644, durable: bool = True
) -> None:
    """Write `name` inside the directory `dir_fd` so that readers see the old file or the whole new one.

    The temporary name starts with '.', so the host's own watcher and agents' clients skip it.

    Args:
        dir_fd: an open directory descriptor (never a path an agent could swap).
        name: a single path component.
        data: the complete content.
        fsync_dir: also fsync the directory so the rename itself survives a power cut.
        mode: permission bits of the new file.
        durable: fsync the content before the rename. Only a file rewritten every few seconds whose loss in a
            power cut costs nothing (a heartbeat) skips it: readers still see the old file or the whole new one.
    """
    tmp = prepare_atomic(dir_fd, name, data, mode=mode, durable=durable)
    try:
        commit_atomic(dir_fd, tmp, name, fsync_dir=fsync_dir)
    except BaseException:
        discard(dir_fd, tmp)
        raise


def temp_name(name: str) -> str:
    """A fresh name to write `name`'s new content under before it is renamed into place (`.<name>.<hex>.tmp`)."""
    return f".{name}.{secrets.token_hex(4)}.tmp"


def temp_target(tmp: str) -> str | None:
    """The name a `temp_name` was made for, or None when `tmp` is not of that form."""
    if not (tmp.startswith(".") and tmp.endswith(".tmp")):
        return None
    target, dot, _ = tmp[1 : -len(".tmp")].rpartition(".")
    return target if dot and target else None


def prepare_atomic(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644, durable: bool = True) -> str:
    """The first half of `write_atomic`: the complete content under a fresh temp name; returns that name.

    Fsync'd before it returns unless not `durable`. Until `commit_atomic` renames it, the temp file's existence says the new file was not published yet.
    """
    tmp = temp_name(name)
    fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb", closefd=True) as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
    except BaseException:
        discard(dir_fd, tmp)
        raise
    return tmp


def create_unsynced(dir_fd: int, name: str, data: bytes, *, mode: int = 0o644) -> tuple[str, int]:
    """`prepare_atomic` without its fsync: the temp name and its still open descriptor, for the caller to fsync.

    The caller owns the descriptor (fsync, then close it) and the temp file (`discard` it if the fsync fails).
    """
    tmp = temp_name(name)
    fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        discard(dir_fd, tmp)
        raise
    return tmp, fd


def commit_atomic(dir_fd: int, tmp: str, name: str, *, fsync_dir: bool = False) -> None:
    """The second half of `write_atomic`: publish a prepared temp file under `name` (kept if that fails)."""
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if fsync_dir:
        os.fsync(dir_fd)


def discard(dir_fd: int, tmp: str) -> None:
    """Remove a prepared temp file that will not be published."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)


def dump_json(document: Any) -> bytes:
    """Serialise a document the way every host-written file is serialised."""
    return dump_json_text(document).encode("utf-8")


def dump_json_text(document: Any) -> str:
    """`dump_json` before its encoding: the text, for a caller that also stores it (a request's result)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def write_json_atomic(dir_fd: int, name: str, document: Any, *, fsync_dir: bool = False, durable: bool = True) -> None:
    """`write_atomic` for a JSON document."""
    write_atomic(dir_fd, name, dump_json(document), fsync_dir=fsync_dir, durable=durable)
