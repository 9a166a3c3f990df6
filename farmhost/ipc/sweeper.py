"""Removing results that no agent collected within the retention time."""

from __future__ import annotations

import os
import stat


def sweep_results(results_fd: int, *, older_than: float) -> int:
    """Delete regular files in `action_results/` last modified before `older_than`; closes the descriptor."""
    removed = 0
    try:
        for name in os.listdir(results_fd):
            try:
                info = os.stat(name, dir_fd=results_fd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_mtime < older_than:
                    os.unlink(name, dir_fd=results_fd)
                    removed += 1
            except FileNotFoundError:
                continue
    finally:
        os.close(results_fd)
    return removed
