"""The staged dashboard files and their backups, opened without following links (blocking; run in a thread).

The dashboards directory is visible to the main agent (`/workspace/dashboard`), so every file in it is opened
relative to a held directory descriptor with O_NOFOLLOW: a link the agent planted (`farm.yaml -> /etc/...`,
`backups -> /`) is refused, never followed. A missing staged copy is seeded from the shipped
`dashboards/<name>.yaml` (package data of the installed wheel, or the checkout's `dashboards/`) when there is one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from farmhost.errors import FarmhostError, InvalidRequest, NotAllowed, NotFound
from farmhost.layout import shipped_dir
from farmhost.protocol.params import MAX_DASHBOARD_BYTES

BACKUPS_DIR: Final = "backups"
BACKUP_RE: Final = re.compile(r"^\d{8}T\d{6}\.\d{6}Z(-\d+)?\.json$")


def shipped_dashboards() -> Path | None:
    """The shipped `dashboards/` directory (package data, or the checkout's in development), or None."""
    return shipped_dir("dashboards")


class Staging:
    """The staged copies and backups under one dashboards directory; blocking, run in a worker thread.

    Every open is relative to a held descriptor of the directory and refuses links, so that a link the agent
    planted (`farm.yaml -> /etc/...`, `backups -> /`) is never followed. A flock on that descriptor serialises
    the read-modify-write of a patch against other patches and applies.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def locked(self) -> Iterator[int]:
        """Hold the directory (a descriptor, exclusively flocked) for a read-modify-write; yields its fd."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = _open_dir(str(self.root), None, "the dashboards directory")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def read(self, name: str) -> str:
        """The staged YAML of `name`, seeded from the shipped dashboard on first use; NotFound if neither."""
        with self.locked() as directory:
            text = self.read_locked(directory, name, missing_ok=False)
        assert text is not None
        return text

    def read_locked(self, directory: int, name: str, *, missing_ok: bool) -> str | None:
        """`read` inside `locked`; with `missing_ok`, None instead of NotFound when there is nothing to seed."""
        filename = f"{name}.yaml"
        text = _read_file(directory, filename)
        if text is not None:
            return text
        shipped = shipped_dashboards()
        source = shipped / filename if shipped is not None else None
        if source is not None and source.is_file() and not source.is_symlink():
            data = source.read_bytes()[: MAX_DASHBOARD_BYTES + 1]
            self.write_locked(directory, filename, data)
            return data.decode("utf-8", errors="replace")
        if missing_ok:
            return None
        where = "and none ships with farmhost" if shipped is None else f"and farmhost ships no dashboards/{filename}"
        raise NotFound(
            f"there is no dashboard {name!r}: no staged copy {filename} {where}; "
            "create it with ha_dashboard_patch (add_view operations)"
        )

    def write_locked(self, directory: int, filename: str, data: bytes) -> None:
        """Replace `filename` atomically inside `locked`, keeping the mode of the file it replaces."""
        mode = 0o644
        with contextlib.suppress(FileNotFoundError, OSError):
            existing = os.stat(filename, dir_fd=directory, follow_symlinks=False)
            if stat.S_ISREG(existing.st_mode):
                mode = stat.S_IMODE(existing.st_mode)
        _write_atomic(directory, filename, data, mode)

    def backup(self, name: str, config: Any, now: datetime, keep: int) -> str:
        """Write `config` (what HA had) as a timestamped JSON file; keep the newest `keep`; return its name."""
        data = (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()
        stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        with self.locked() as directory:
            backups = _subdir(directory, BACKUPS_DIR)
            try:
                folder = _subdir(backups, name)
                try:
                    for n in range(100):  # two backups in one microsecond: -1, -2, ...
                        filename = f"{stamp}-{n}.json" if n else f"{stamp}.json"
                        if _create_new(folder, filename, data):
                            break
                    else:
                        raise FarmhostError(f"could not find a free backup file name for {stamp}")
                    _rotate(folder, max(1, keep))
                finally:
                    os.close(folder)
            finally:
                os.close(backups)
        return filename


def _refused_link(what: str) -> NotAllowed:
    return NotAllowed(
        f"{what} is a symbolic link or not a regular file/directory; farmhost does not follow links there"
    )


def _open_dir(path: str, parent: int | None, what: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused_link(what) from None
        raise


def _subdir(parent: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent)
    return _open_dir(name, parent, f"dashboards/{name}")


def _read_file(directory: int, filename: str) -> str | None:
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _refused_link(f"the staged dashboard {filename}") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            raise _refused_link(f"the staged dashboard {filename}")
        if info.st_size > MAX_DASHBOARD_BYTES:
            raise InvalidRequest(f"the staged dashboard {filename} is larger than {MAX_DASHBOARD_BYTES // 1024} KiB")
        data = handle.read(MAX_DASHBOARD_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"the staged dashboard {filename} is not UTF-8 text (byte {err.start})") from None


def _write_atomic(directory: int, filename: str, data: bytes, mode: int) -> None:
    """Temp file + fsync + rename in the same directory, then fsync the directory."""
    temp = f".{filename}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(temp, filename, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=directory)
        if isinstance(err, IsADirectoryError):
            raise _refused_link(f"the staged dashboard {filename}") from None
        raise
    os.fsync(directory)


def _backup_order(name: str) -> tuple[str, int]:
    """Oldest first: by time stamp, then by the `-n` that separates two backups of the same microsecond."""
    match = BACKUP_RE.fullmatch(name)
    suffix = match.group(1) if match else None
    return name[:23], int(suffix[1:]) if suffix else 0


def _create_new(directory: int, filename: str, data: bytes) -> bool:
    try:
        fd = os.open(
            filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory
        )
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.fsync(directory)
    return True


def _rotate(directory: int, keep: int) -> None:
    names = sorted((name for name in os.listdir(directory) if BACKUP_RE.fullmatch(name)), key=_backup_order)
    for name in names[:-keep]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=directory)
