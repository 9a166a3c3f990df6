"""A clock tests step by hand: the scheduler's `SchedulerClock` without the wall clock, so no test sleeps for a due time.

`advance()`/`set()` move the time and wake every nap; `napping` says the scheduler has looked at the time since the
last move (it fired what was due and naps again), the condition a test waits for before it checks that nothing
else fired.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta


class ManualClock:
    """Stands still until a test moves it; a nap returns at once when its time has come, else at the next move."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._naps: set[asyncio.Future[None]] = set()

    def now(self) -> datetime:
        """The time the test last set."""
        return self._now

    def set(self, moment: datetime) -> None:
        """Move to `moment` (either way) and wake every nap: its owner looks at the time again."""
        self._now = moment
        for nap in self._naps:
            if not nap.done():
                nap.set_result(None)
        self._naps.clear()

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move forward by `seconds` and wake every nap; returns the new time."""
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        self.set(self._now + step)
        return self._now

    @property
    def napping(self) -> bool:
        """Someone naps on this clock, and began after the last move: it has seen the current time."""
        return any(not nap.done() for nap in self._naps)

    async def nap(self, until: datetime | None) -> None:
        """Return now if `until` has come, else at the next move (the caller looks at the time again)."""
        if until is not None and until <= self._now:
            return
        nap = asyncio.get_running_loop().create_future()
        self._naps.add(nap)
        try:
            await nap
        finally:
            self._naps.discard(nap)
