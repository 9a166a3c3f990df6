"""The screenshot's file in the group's workspace, written without ever following a link.

`screenshots/` opened (created) with O_NOFOLLOW and held by descriptor, the PNG written atomically inside it,
its name, and its size read back from the PNG header.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import struct
from datetime import UTC
from typing import TYPE_CHECKING, Final

from farmhost.errors import FarmhostError, NotAllowed, NotFound
from farmhost.protocol.codes import ErrorCode

if TYPE_CHECKING:
    from pathlib import Path

    from farmhost.farm.dashboards.screenshots.params import ShotParams
    from farmhost.handling import RequestContext

SCREENSHOTS_DIR: Final = "screenshots"
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; upstream_error if the browser returned something else."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise FarmhostError("the browser did not return a PNG image", code=ErrorCode.UPSTREAM_ERROR)
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def open_screenshots_dir(workspace: Path) -> int:
    """Open (creating it) `screenshots/` in the workspace without following links; the caller closes the fd.

    Raises:
        NotFound: the workspace does not exist.
        NotAllowed: the workspace or `screenshots` is a symlink or not a directory.
    """
    try:
        ws_fd = os.open(workspace, _DIR_FLAGS)
    except FileNotFoundError:
        raise NotFound("the group's workspace does not exist") from None
    except OSError as err:
        raise NotAllowed(f"the group's workspace cannot be opened safely ({err.strerror})") from None
    try:
        with contextlib.suppress(FileExistsError):  # mkdir never follows a symlink at the last component
            os.mkdir(SCREENSHOTS_DIR, 0o755, dir_fd=ws_fd)
        try:
            return os.open(SCREENSHOTS_DIR, _DIR_FLAGS, dir_fd=ws_fd)
        except OSError as err:
            raise NotAllowed(
                f"{SCREENSHOTS_DIR}/ in the workspace is a symlink or not a directory ({err.strerror}); remove it"
            ) from None
    finally:
        os.close(ws_fd)


def write_png(dir_fd: int, name: str, data: bytes) -> None:
    """Write `name` atomically (temp + fsync + rename) inside the held directory.

    Raises:
        NotAllowed: something that is not a regular file already has that name.
    """
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise NotAllowed(f"{SCREENSHOTS_DIR}/{name} exists and is not a regular file; nothing was written")
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a directory entry, never a link target
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def file_name(shot: ShotParams, ctx: RequestContext) -> str:
    """`<dashboard>[-<view>]-<UTC stamp>-<requestId>.png`: unique per request, readable, under NAME_MAX."""
    view = f"-{shot.view}" if shot.view else ""
    return f"{shot.dashboard}{view}-{ctx.now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{ctx.request_id[:64]}.png"
