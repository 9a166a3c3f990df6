"""Opening files inside a group's workspace by a relative path, refusing links and every escape."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from farmhost.errors import InvalidRequest, NotAllowed, NotFound
from farmhost.files import DIR_FLAGS

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
NAME_MAX: Final = 255  # bytes in one path component on Linux filesystems


def split_relative(path: str) -> list[str]:
    """The components of a workspace-relative path.

    Raises:
        InvalidRequest: absolute paths, `..`, empty or `.` components, backslashes, NUL, control characters,
            a component longer than a file name can be.
    """
    if not path or "\x00" in path or any(ord(c) < 32 for c in path):
        raise InvalidRequest("path must be non-empty text without control characters")
    if "\\" in path:
        raise InvalidRequest(f"path {path!r} contains a backslash; use '/' between folders")
    if path.startswith("/"):
        raise InvalidRequest(f"path {path!r} is absolute; give a path relative to the group's workspace")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidRequest(f"path {path!r} must not contain empty, '.' or '..' parts")
    if any(len(os.fsencode(part)) > NAME_MAX for part in parts):
        raise InvalidRequest(f"path {path[:80]!r}... has a part over {NAME_MAX} bytes; no file can have that name")
    return parts


def open_workspace_file(workspace: Path, path: str) -> int:
    """Open a regular file inside `workspace`, walking each component without following links.

    Returns:
        A read-only descriptor (the caller closes it).

    Raises:
        InvalidRequest: a malformed path.
        NotAllowed: a component is a symlink or the target is not a regular file.
        NotFound: nothing at that path.
    """
    parts = split_relative(path)
    fd = os.open(workspace, DIR_FLAGS)
    try:
        for part in parts[:-1]:
            fd = _step(fd, part, path)
        try:
            file_fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            raise NotFound(f"no file at {path!r} in the group's workspace") from None
        except OSError as err:
            raise NotAllowed(f"{path!r} is a symlink or cannot be opened safely ({err.strerror})") from None
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(file_fd)
        raise NotAllowed(f"{path!r} is not a regular file with a single link")
    return file_fd


def _step(fd: int, part: str, path: str) -> int:
    """Open the child directory and close `fd`; on failure `fd` stays open for the caller to close (once)."""
    try:
        child = os.open(part, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        raise NotFound(f"no file at {path!r} in the group's workspace") from None
    except OSError as err:
        raise NotAllowed(f"{path!r} goes through a symlink or a non-directory ({err.strerror})") from None
    os.close(fd)
    return child
