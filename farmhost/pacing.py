"""BytePacer: spreads bulk file copies over time, so they never saturate the disk every group's results share.

Every result is fsynced, and on ext4 an fsync waits for the journal, which carries whatever other files have
dirty. A group sending 40 MiB files back to back would make every group's answers wait for the disk. Copies
reserve their chunks' time on one shared budget (bytes per second) and sleep, in their thread, until it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class BytePacer:
    """A shared write budget for copies that run in threads."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._free_at = 0.0

    def take(self, nbytes: int, bytes_per_second: float) -> None:
        """Wait (in the calling thread) until `nbytes` more may be written; 0 or less means no limit."""
        if bytes_per_second <= 0:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._free_at)
            self._free_at = start + nbytes / bytes_per_second
        if start > now:
            self._sleep(start - now)
