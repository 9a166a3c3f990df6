"""The memory files of a workspace: which exist (a symlink-safe, bounded walk), their signatures, reading one."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

MEMORY_FILE: Final = "MEMORY.md"
MEMORY_DIR: Final = "memory"
MD_SUFFIX: Final = ".md"
# Bounds on what an agent can make the host read: memory is notes, not a data lake.
MAX_FILE_BYTES: Final = 1 << 20  # read of one file for the index (its first MiB is searched)
MAX_SERVED_BYTES: Final = 4 * 1024 * 1024  # a bigger file is neither searched nor read by memory_get
MAX_FILES_PER_ROOT: Final = 2000
MAX_DEPTH: Final = 16

logger = logging.getLogger(__name__)
_capped: set[Path] = set()  # roots already warned about, so a listing at every search does not repeat it

OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

Signature = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)
# (open directory fd, its path relative to the root): told of each directory the walk is about to read.
OnDir = Callable[[int, str], None]


def signature(st: os.stat_result) -> Signature:
    """What tells a changed file from an unchanged one: (inode, size, mtime_ns, ctime_ns)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# `%2e`: what a path that was URL-encoded looks like; memory paths are plain, never decoded.
URL_ESCAPE: Final = re.compile(r"%[0-9A-Fa-f]{2}")


def plain_name(name: str) -> bool:
    """Whether memory_get can be asked for a file or folder of this name (no backslash, URL escape or control).

    The walk skips every other name, so each hit's citation is a path memory_get opens.
    """
    return "\\" not in name and URL_ESCAPE.search(name) is None and all(ord(c) >= 32 for c in name)


def is_memory_name(name: str) -> bool:
    """Whether a file of this name under `memory/` is indexed (its type and size are checked separately)."""
    return name.endswith(MD_SUFFIX) and plain_name(name)


def _servable(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_size <= MAX_SERVED_BYTES


def _walk_md(dir_fd: int, prefix: str, depth: int, on_dir: OnDir | None) -> Iterator[tuple[str, os.stat_result]]:
    """Regular `*.md` files under an open directory, never following a symlink; sorted by name."""
    if depth > MAX_DEPTH:
        return
    if on_dir is not None:
        on_dir(dir_fd, prefix)
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        rel = f"{prefix}/{entry.name}"
        if stat.S_ISDIR(st.st_mode) and plain_name(entry.name):
            try:
                sub_fd = os.open(entry.name, OPEN_DIR, dir_fd=dir_fd)
            except OSError:
                continue  # a symlink swapped in since the stat, or gone: skip
            try:
                yield from _walk_md(sub_fd, rel, depth + 1, on_dir)
            finally:
                os.close(sub_fd)
        elif _servable(st) and is_memory_name(entry.name):
            yield rel, st


def walk_root(root: Path, on_dir: OnDir | None = None) -> dict[str, os.stat_result]:
    """Memory files of one workspace root and their `lstat`; what memory_get would refuse is skipped.

    Symlinks (files or dirs) are skipped, and so are names and sizes memory_get refuses (`plain_name`,
    MAX_SERVED_BYTES), so every citation of a hit is a path it opens; a file of more than one link is listed but
    not read (`read_memory_file`).

    Args:
        root: The workspace directory (trusted, may itself be reached through a link).
        on_dir: Called with each open directory and its relative path ("" for the root, then "memory",
            "memory/x", ...) before that directory is read, so a watch added there sees every later change.
    """
    found: dict[str, os.stat_result] = {}
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        if on_dir is not None:
            on_dir(root_fd, "")
        try:
            st = os.stat(MEMORY_FILE, dir_fd=root_fd, follow_symlinks=False)
            if _servable(st):
                found[MEMORY_FILE] = st
        except OSError:
            pass
        try:
            mem_fd = os.open(MEMORY_DIR, OPEN_DIR, dir_fd=root_fd)
        except OSError:
            return found
        try:
            for rel, st in _walk_md(mem_fd, MEMORY_DIR, 1, on_dir):
                if len(found) >= MAX_FILES_PER_ROOT:
                    _warn_capped(root)
                    break
                found[rel] = st
        finally:
            os.close(mem_fd)
    finally:
        os.close(root_fd)
    return found


def read_memory_file(root: Path, rel: str) -> str | None:
    """Read a memory file relative to `root`, opening every path component with O_NOFOLLOW.

    Args:
        root: The workspace directory (trusted, may itself be reached through a link).
        rel: A "/"-separated relative path such as "memory/fields/north.md".

    Returns:
        The text (invalid UTF-8 replaced, at most MAX_FILE_BYTES read), or None when the file is
        missing, is not a file memory_get would serve (a regular file of one link and at most MAX_SERVED_BYTES),
        or any component is a symlink.
    """
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for part in parts[:-1]:
            fds.append(os.open(part, OPEN_DIR, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], _OPEN_FILE, dir_fd=fds[-1]))
        opened = os.fstat(fds[-1])
        # One link, as memory_get asks (farmhost/workspace.py): a hard link is another file's content, named here.
        # The walk lists such a file still, so its root's watch knows to re-list it (farmhost/memory/watch.py).
        if not _servable(opened) or opened.st_nlink != 1:
            return None
        with os.fdopen(os.dup(fds[-1]), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENXIO, errno.EISDIR):
            return None
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return data.decode("utf-8", errors="replace")


def _warn_capped(root: Path) -> None:
    if root in _capped:
        return
    _capped.add(root)
    logger.warning(
        "memory of %s has more than %s files: only the first %s (by name) are searched; merge notes into fewer files",
        root,
        f"{MAX_FILES_PER_ROOT:,}",
        f"{MAX_FILES_PER_ROOT:,}",
        extra={"event": "memory_files_capped", "root": str(root), "limit": MAX_FILES_PER_ROOT},
    )
