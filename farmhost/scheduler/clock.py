"""The scheduler's time: what time it is, and a nap until a due time; the daemon's follows the host's wall clock.

`SchedulerService` reads the time and waits for due times only through a `SchedulerClock`, so a test can hand it a
clock it steps by hand (`farmhost_dev.clock.ManualClock`) instead of sleeping on the real one.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Final, Protocol

from farmhost.store.db import now_utc

# The longest a wall-clock nap lasts before the scheduler looks at the time again (see `WallClock.nap`).
TICK_SECONDS: Final = 1.0


class SchedulerClock(Protocol):
    """The time the scheduler claims by, and its wait for the next due time."""

    def now(self) -> datetime:
        """The current time (aware)."""
        ...

    async def nap(self, until: datetime | None) -> None:
        """Return by `until` (None: no due time, no deadline) or earlier; the caller then looks at `now()` again."""
        ...


class WallClock:
    """The host's clock: naps of at most TICK_SECONDS while a due time is ahead, none at all without one."""

    def now(self) -> datetime:
        """The wall clock, in UTC."""
        return now_utc()

    async def nap(self, until: datetime | None) -> None:
        """Sleep towards `until`, at most TICK_SECONDS.

        asyncio sleeps on the monotonic clock, the due times are wall-clock times. A Pi has no RTC: when NTP steps
        the wall clock forward after boot, a nap for the old delay would make a due job wait it out; looking again
        every second notices the step within a second.
        """
        if until is None:
            await asyncio.get_running_loop().create_future()  # until cancelled: a sync wakes the caller
            return
        left = (until - now_utc()).total_seconds()
        if left > 0:
            await asyncio.sleep(min(left, TICK_SECONDS))
