"""Housekeeping of the IPC tree: uncollected results, the host's own abandoned temp files, old quarantine."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from typing import Final

from farmhost.files import DIR_FLAGS

# The temporary names farmhost.files creates: ".<name>.<8 hex>.tmp". Only the host's own are removed.
HOST_TEMP_RE = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")
# Entries one quarantine sweep may remove: it runs on the event loop, and a planted directory may hold a million.
MAX_SWEEP_REMOVALS: Final = 10_000


def _sweep(dir_fd: int, keep: Callable[[str, os.stat_result], bool]) -> int:
    removed = 0
    for name in os.listdir(dir_fd):
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISREG(info.st_mode) and not keep(name, info):
                os.unlink(name, dir_fd=dir_fd)
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def sweep_results(results_fd: int, *, older_than: float) -> int:
    """Delete regular files in `action_results/` last modified before `older_than`; closes the descriptor."""
    try:
        return _sweep(results_fd, lambda name, info: info.st_mtime >= older_than)
    finally:
        os.close(results_fd)


def sweep_host_temp(dir_fd: int, *, older_than: float, pending: Callable[[str], bool] = lambda name: False) -> int:
    """Delete the host's own temp files (left by a kill -9 mid-write) last modified before `older_than`.

    `pending(name)` says a temp file is a prepared result a restart may still publish: it stays.
    """
    return _sweep(
        dir_fd, lambda name, info: not HOST_TEMP_RE.fullmatch(name) or info.st_mtime >= older_than or pending(name)
    )


def sweep_quarantine(errors_fd: int, *, older_than: float, budget: int = MAX_SWEEP_REMOVALS) -> int:
    """Delete quarantined entries and their notes older than `older_than` in every group's quarantine.

    Quarantine holds whatever an agent planted: regular files, but also symlinks, FIFOs, sockets and whole
    directories. Each goes by descriptor, never following a link; a sweep removes at most `budget` entries
    (counting those inside directories), and what is left goes at the next sweep. Returns the number of
    quarantined entries (and notes) removed.
    """
    removed = 0
    left = [budget]
    for folder in os.listdir(errors_fd):
        if folder.startswith("."):
            continue  # the trash (quarantine.TRASH) is emptied by its own drain
        try:
            fd = os.open(folder, DIR_FLAGS, dir_fd=errors_fd)
        except OSError:
            continue
        try:
            for name in os.listdir(fd):
                if left[0] <= 0:
                    return removed
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if info.st_mtime >= older_than:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        gone = _remove_tree(fd, name, left)
                        if not gone:  # partly emptied: keep its age, or the rest would wait another retention period
                            with contextlib.suppress(OSError):
                                os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=fd)
                        removed += gone
                    else:
                        os.unlink(name, dir_fd=fd)
                        left[0] -= 1
                        removed += 1
                except FileNotFoundError:
                    continue
        finally:
            os.close(fd)
    return removed


def _remove_tree(parent_fd: int, name: str, left: list[int]) -> int:
    """Remove the directory `name` and everything in it, spending `left[0]`; returns 1 if it is gone, else 0.

    Iterative (an agent's tree may be deeper than Python's recursion limit) and by descriptor: each directory is
    opened with O_NOFOLLOW relative to its parent, and a link inside is unlinked, never followed.
    """
    try:
        top = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return 0
    opened: list[tuple[int, str]] = [(top, name)]  # each open directory with its name in the one before it
    try:
        while opened:
            fd = opened[-1][0]
            subdir = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if left[0] <= 0:
                        return 0
                    if entry.is_dir(follow_symlinks=False):
                        subdir = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
                    left[0] -= 1
            if subdir is not None:
                opened.append((os.open(subdir, DIR_FLAGS, dir_fd=fd), subdir))
                continue
            done_fd, done_name = opened.pop()
            os.close(done_fd)
            os.rmdir(done_name, dir_fd=opened[-1][0] if opened else parent_fd)
            left[0] -= 1
        return 1
    except OSError:
        return 0
    finally:
        for fd, _ in opened:
            os.close(fd)


def empty_trash(trash_fd: int, *, budget: int = MAX_SWEEP_REMOVALS) -> int:
    """Remove up to `budget` entries from the quarantine's trash (blocking: in a thread); closes `trash_fd`.

    Returns how many entries are left to remove (0: the trash is empty).
    """
    left = [budget]
    try:
        for name in os.listdir(trash_fd):
            if left[0] <= 0:
                return 1
            info = os.stat(name, dir_fd=trash_fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if not _remove_tree(trash_fd, name, left):
                    return 1
            else:
                os.unlink(name, dir_fd=trash_fd)
                left[0] -= 1
        return 0
    finally:
        os.close(trash_fd)
