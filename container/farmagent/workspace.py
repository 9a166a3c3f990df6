"""The tools that work on the sandbox's own mounts: `memory_write` (the group's memory) and `farm_state_read`.

Neither sends a request: the workspace is mounted read-write at FARMAGENT_GROUP_DIR and the host's farm-state
files read-only at FARMAGENT_FARM_STATE_DIR. The host still sees a memory write at once, because its
memory_search re-indexes every file whose size, mtime or inode changed.

Paths follow the host's memory_get rules (farmhost/memory/get.py): `MEMORY.md` or `memory/<...>.md`, relative,
no `..`, no backslash, no NUL or control character, nothing URL-encoded, no hidden component. Every component
is opened relative to a held directory descriptor with O_NOFOLLOW, so a symlink anywhere on the way (a
`memory` folder linked elsewhere, a memory file linked to a file outside) is refused, never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Final, Literal

from farmagent.errors import ConfigError, InvalidRequestError, NotAllowedError, NotFoundError, ProtocolError

WriteMode = Literal["append", "replace"]
WRITE_MODES: Final = ("append", "replace")

MEMORY_FILE: Final = "MEMORY.md"
MEMORY_DIR: Final = "memory"
# Memory is notes, not a data dump: 256 KiB is a long book chapter, and the host indexes files up to 1 MiB.
MAX_MEMORY_BYTES: Final = 256 * 1024
# `memory/a/b/c.md` is 4 components; the host's indexer stops at 16 levels.
MAX_MEMORY_COMPONENTS: Final = 8
# Leaves room for the temporary name (`.<name>.<8 hex>.tmp`) under the usual 255-byte file name limit.
MAX_NAME_BYTES: Final = 200

FARM_STATE_FILES: Final = ("current", "alerts", "devices", "calendar")
# current.json of a farm with a few thousand entities is well under a megabyte.
MAX_FARM_STATE_BYTES: Final = 8 * 1024 * 1024
FARM_STATE_MISSING: Final = "farm state is not available yet; Home Assistant may not be configured"

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS: Final = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def memory_path(path: str) -> list[str]:
    """The components of a memory path an agent may write, checked like the host's memory_get.

    Raises:
        InvalidRequestError: a malformed path (empty, control characters, URL-encoded, backslash, absolute,
            empty / `.` / `..` components, invalid Unicode, a component too long).
        NotAllowedError: a well-formed path outside `MEMORY.md` and `memory/**/*.md`, or a hidden component.
    """
    if not path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise InvalidRequestError("path must be non-empty text without NUL or control characters")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"path {path!r} is not valid Unicode") from None
    if "%" in path:
        raise InvalidRequestError(f"path {path!r} looks URL-encoded; give the plain relative path")
    if "\\" in path:
        raise InvalidRequestError(f"path {path!r} contains a backslash; use '/' between folders")
    if path.startswith("/"):
        raise InvalidRequestError(f"path {path!r} is absolute; give a path relative to the workspace, e.g. MEMORY.md")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidRequestError(f"path {path!r} must not contain empty, '.' or '..' parts")
    if any(len(part.encode("utf-8")) > MAX_NAME_BYTES for part in parts):
        raise InvalidRequestError(f"path {path!r} has a part longer than {MAX_NAME_BYTES} bytes")
    if any(part.startswith(".") for part in parts):
        raise NotAllowedError(f"path {path!r} has a hidden part (starting with '.'); memory files are never hidden")
    if parts != [MEMORY_FILE] and not (len(parts) >= 2 and parts[0] == MEMORY_DIR and parts[-1].endswith(".md")):
        raise NotAllowedError(f"memory_write writes only MEMORY.md or memory/<name>.md, not {path!r}")
    if len(parts) > MAX_MEMORY_COMPONENTS:
        raise NotAllowedError(f"path {path!r} is nested too deep (at most {MAX_MEMORY_COMPONENTS} parts)")
    return parts


def memory_write(group_dir: Path, path: str, text: str, mode: str = "append") -> dict[str, Any]:
    """Append `text` to, or replace with it, a memory file of the group's workspace.

    A final newline is added to `text` when missing, and an append to a file that does not end with one starts
    on a new line. Folders under `memory/` are created as needed. `replace` is atomic (temporary file, fsync,
    rename in the same folder): a reader sees the old file or the new one. Nothing is written when the file
    would exceed MAX_MEMORY_BYTES.

    Returns:
        `{"path", "bytes", "lines"}`: the file's size and line count after the write.

    Raises:
        InvalidRequestError: a malformed path, an unknown mode, text with NUL or invalid Unicode.
        NotAllowedError: a path outside the memory files, a symlink or non-regular file on the way, the size
            limit, or the file system refusing the write.
        ConfigError: the workspace itself (FARMAGENT_GROUP_DIR) cannot be opened.
    """
    parts = memory_path(path)
    if mode not in WRITE_MODES:
        raise InvalidRequestError(f"mode must be 'append' or 'replace', not {mode!r}")
    data = _encode(text)
    if len(data) > MAX_MEMORY_BYTES:
        raise NotAllowedError(_too_big(path, len(data)))
    try:
        fd = os.open(group_dir, _DIR_FLAGS)
    except OSError as err:
        raise ConfigError(
            f"the workspace {group_dir} (FARMAGENT_GROUP_DIR) cannot be opened ({err.strerror})"
        ) from None
    try:
        for depth, part in enumerate(parts[:-1], start=1):
            fd = _enter(fd, part, "/".join(parts[:depth]))
        content = _append(fd, parts[-1], data, path) if mode == "append" else _replace(fd, parts[-1], data, path)
    finally:
        os.close(fd)
    return {"path": path, "bytes": len(content), "lines": content.count(b"\n")}


def farm_state_read(farm_state_dir: Path, name: str) -> Any:
    """The parsed JSON of `<farm_state_dir>/<name>.json` (name: current, alerts, devices or calendar).

    Raises:
        InvalidRequestError: an unknown name.
        NotFoundError: the host has not written the file (or the directory) yet.
        NotAllowedError: the file is a symlink, not a regular file, or over MAX_FARM_STATE_BYTES.
        ProtocolError: the file is not JSON.
    """
    if name not in FARM_STATE_FILES:
        raise InvalidRequestError(f"file must be one of {', '.join(FARM_STATE_FILES)}, not {name!r}")
    filename = f"{name}.json"
    try:
        dir_fd = os.open(farm_state_dir, _DIR_FLAGS)
    except FileNotFoundError:
        raise NotFoundError(f"{FARM_STATE_MISSING} (there is no {farm_state_dir})") from None
    except OSError as err:
        raise NotAllowedError(f"{farm_state_dir} cannot be opened as a directory ({err.strerror})") from None
    try:
        try:
            fd = os.open(filename, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise NotFoundError(f"{FARM_STATE_MISSING} ({filename} has not been written)") from None
        except OSError as err:
            raise NotAllowedError(_unsafe(dir_fd, filename, filename, err, "farm_state_read")) from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAllowedError(f"{filename} in farm-state is not a regular file; only regular files are read")
        if info.st_size > MAX_FARM_STATE_BYTES:
            raise NotAllowedError(f"{filename} is {info.st_size} bytes, over the {MAX_FARM_STATE_BYTES}-byte limit")
        data = _read_all(fd, MAX_FARM_STATE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"{filename} in farm-state is not valid JSON ({err}); try again shortly") from None


def _encode(text: str) -> bytes:
    if "\x00" in text:
        raise InvalidRequestError("text must not contain NUL characters")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError("text is not valid Unicode (it contains a lone surrogate)") from None
    return data if data.endswith(b"\n") else data + b"\n"


def _too_big(path: str, size: int) -> str:
    return (
        f"{path!r} would be {size} bytes, over the {MAX_MEMORY_BYTES}-byte limit for a memory file; nothing was "
        "written. Keep notes short, or start another file under memory/"
    )


def _enter(fd: int, part: str, shown: str) -> int:
    """Open (creating it if missing) the folder `part` under `fd` and close `fd`; on failure `fd` stays open."""
    try:
        child = os.open(part, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as err:
            raise NotAllowedError(_unsafe(fd, part, shown, err, "memory_write")) from None
    except OSError as err:
        raise NotAllowedError(_unsafe(fd, part, shown, err, "memory_write")) from None
    os.close(fd)
    return child


def _unsafe(dir_fd: int, name: str, shown: str, err: OSError, tool: str) -> str:
    """Why `name` under `dir_fd` could not be opened, naming a symlink as such."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISLNK(mode):
        return f"{shown!r} is a symlink; {tool} never follows links"
    return f"{shown!r} cannot be opened safely ({err.strerror})"


def _check_regular(info: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        raise NotAllowedError(f"{path!r} is not a regular file with a single link; memory_write leaves it alone")


def _append(dir_fd: int, name: str, data: bytes, path: str) -> bytes:
    try:
        fd = os.open(name, _APPEND_FLAGS, 0o644, dir_fd=dir_fd)
    except OSError as err:
        raise NotAllowedError(_unsafe(dir_fd, name, path, err, "memory_write")) from None
    try:
        info = os.fstat(fd)
        _check_regular(info, path)
        if info.st_size + len(data) > MAX_MEMORY_BYTES:
            raise NotAllowedError(_too_big(path, info.st_size + len(data)))
        old = _read_all(fd, info.st_size, offset=0)
        if old and not old.endswith(b"\n"):
            data = b"\n" + data
            if len(old) + len(data) > MAX_MEMORY_BYTES:
                raise NotAllowedError(_too_big(path, len(old) + len(data)))
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, info.st_size)  # a partial append (disk full) is taken back
            raise NotAllowedError(f"could not append to {path!r} ({err.strerror}); nothing was written") from None
    finally:
        os.close(fd)
    return old + data


def _replace(dir_fd: int, name: str, data: bytes, path: str) -> bytes:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise NotAllowedError(_unsafe(dir_fd, name, path, err, "memory_write")) from None
    else:
        try:
            _check_regular(os.fstat(fd), path)
        finally:
            os.close(fd)
    # Starts with '.' and ends in .tmp: neither the host's indexer nor memory_get ever reads it.
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, _TEMP_FLAGS, 0o644, dir_fd=dir_fd)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise NotAllowedError(f"could not write {path!r} ({err.strerror}); the old file is unchanged") from None
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)  # the rename itself survives a power cut
    return data


def _read_all(fd: int, limit: int, *, offset: int | None = None) -> bytes:
    """Up to `limit` bytes from `fd` (at `offset` without moving the file position, else from the position)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.pread(fd, limit - got, offset + got) if offset is not None else os.read(fd, limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
