"""Housekeeping of the IPC tree: uncollected results, the host's own abandoned temp files, old quarantine."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable

from farmhost.ipc.groupdir import DIR_FLAGS

# The temporary names farmhost.ipc.writer creates: ".<name>.<8 hex>.tmp". Only the host's own are removed.
HOST_TEMP_RE = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")


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
        dir_fd, lambda name, info: not HOST_TEMP_RE.match(name) or info.st_mtime >= older_than or pending(name)
    )


def sweep_quarantine(errors_fd: int, *, older_than: float) -> int:
    """Delete quarantined regular files and their notes older than `older_than` in every group's quarantine."""
    removed = 0
    for folder in os.listdir(errors_fd):
        try:
            fd = os.open(folder, DIR_FLAGS, dir_fd=errors_fd)
        except OSError:
            continue
        try:
            removed += _sweep(fd, lambda name, info: info.st_mtime >= older_than)
        finally:
            os.close(fd)
    return removed
