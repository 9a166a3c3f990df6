"""Sleeping until something lands in `action_results/`: inotify when it works, polling with backoff otherwise.

An inotify instance is kept for the next wait on the same directory instead of closed: closing one waits for
the kernel's RCU grace period, milliseconds each time, which was most of a tool call's cost through MCP.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import inotify_simple
from inotify_simple import INotify
from inotify_simple import flags as f

from farmagent.config import WaitMode

# Polling backoff: a fast answer (ping, memory) is seen within 200 ms, a slow one (HA, screenshots) costs
# one stat per second at most.
POLL_STEPS: Final = (0.2, 0.5, 1.0)
# With inotify the directory is still rescanned this often, in case an event was lost (queue overflow).
INOTIFY_RESCAN: Final = 1.0
# Idle instances kept per directory: as many as calls wait at once (an MCP server runs tools in threads).
_KEEP: Final = 8
_idle: dict[tuple[Path, int], list[INotify]] = {}
_idle_lock = threading.Lock()


@atexit.register
def _close_idle() -> None:
    with _idle_lock:
        for kept in _idle.values():
            for inotify in kept:
                inotify.close()
        _idle.clear()


def _new_inotify() -> INotify:
    # inotify_simple finds libc with ctypes.util.find_library('c'), which runs `ldconfig -p` in a subprocess: 35 ms
    # of every agent run's first tool call. The interpreter has libc loaded already; hand it that one.
    if inotify_simple._libc is None:
        inotify_simple._libc = ctypes.CDLL(None, use_errno=True)
    return INotify()


def _reuse(directory: Path, inode: int) -> INotify | None:
    with _idle_lock:
        kept = _idle.get((directory, inode))
        inotify = kept.pop() if kept else None
    if inotify is not None:
        inotify.read(timeout=0)  # events of earlier waits: the caller looks at the directory itself first
    return inotify


def _keep(directory: Path, inode: int, inotify: INotify) -> None:
    with _idle_lock:
        kept = _idle.setdefault((directory, inode), [])
        if len(kept) < _KEEP:
            kept.append(inotify)
            return
    inotify.close()


class ResultWatch:
    """A context manager that blocks in `sleep(limit)` until the results directory changes or `limit` passes.

    Falls back to polling (and says so once on stderr) when inotify cannot watch the directory, for example on
    a filesystem without inotify support or when the process ran out of inotify instances.
    """

    def __init__(self, directory: Path, *, mode: WaitMode = "inotify") -> None:
        self.directory = directory
        self.mode: WaitMode = mode
        self._inotify: INotify | None = None
        self._inode = 0
        self._step = 0

    def __enter__(self) -> Self:
        if self.mode == "inotify":
            try:
                # Keyed by inode: a directory the host recreated is watched anew.
                self._inode = os.stat(self.directory).st_ino
                self._inotify = _reuse(self.directory, self._inode)
                if self._inotify is None:
                    self._inotify = _new_inotify()
                    # Results are renamed into place (SPEC): the rename is the one event worth waking for.
                    self._inotify.add_watch(self.directory, f.MOVED_TO)
            except OSError as err:
                self._close()
                self.mode = "poll"
                print(f"farmagent: cannot watch {self.directory} ({err.strerror}); polling instead", file=sys.stderr)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._inotify is not None:
            _keep(self.directory, self._inode, self._inotify)
            self._inotify = None

    def sleep(self, limit: float) -> None:
        """Wait at most `limit` seconds: until an inotify event, or for the next polling step."""
        if limit <= 0:
            return
        if self._inotify is not None:
            self._inotify.read(timeout=max(1, int(min(limit, INOTIFY_RESCAN) * 1000)))
            return
        step = POLL_STEPS[min(self._step, len(POLL_STEPS) - 1)]
        self._step += 1
        time.sleep(min(limit, step))

    def _close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
