"""ChurnBackoff: how soon the host re-checks a group's IPC directories when the group keeps replacing them.

Re-opening a swapped queue directory, evicting what was planted and re-watching it is work on the one event loop
every group shares. The first few re-opens in a window are handled at once; a group that keeps swapping its
directories gets them checked later and later (up to every few seconds), so its attack slows only its own queues.
It is served at once again after a quiet window.
"""

from __future__ import annotations

import logging
from collections import deque

logger = logging.getLogger(__name__)

FREE_REOPENS = 8  # re-opens within WINDOW_S handled at once
WINDOW_S = 10.0
FIRST_DELAY_S = 0.25
MAX_DELAY_S = 4.0


class ChurnBackoff:
    """Decides, for one group, how long to wait before the next check of its directories."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._times: deque[float] = deque(maxlen=FREE_REOPENS)
        self._seen = 0
        self.delay_s = 0.0

    @property
    def throttled(self) -> bool:
        """Whether checks of this group are being deferred."""
        return self.delay_s > 0

    def next_delay(self, now: float, reopens: int) -> float:
        """Seconds to wait before the next check, given the group's re-open count so far (monotonic `now`)."""
        fresh, self._seen = reopens - self._seen, reopens
        self._times.extend([now] * min(fresh, FREE_REOPENS))
        while self._times and self._times[0] < now - WINDOW_S:
            self._times.popleft()
        if not self.throttled:
            if len(self._times) < FREE_REOPENS:
                return 0.0
            self.delay_s = FIRST_DELAY_S
            logger.warning(
                "group %s replaced its IPC directories %d times within %g s: the host now checks them at most "
                "every %g s, which slows only this group's queues",
                self._folder,
                FREE_REOPENS,
                WINDOW_S,
                MAX_DELAY_S,
            )
            return self.delay_s
        if not self._times:
            logger.info("group %s has left its IPC directories alone for %g s; served at once again", self._folder,
                        WINDOW_S)  # fmt: skip
            self.delay_s = 0.0
            return 0.0
        self.delay_s = min(MAX_DELAY_S, self.delay_s * 2)
        return self.delay_s
