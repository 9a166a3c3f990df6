"""FairAdmission: which group's request starts next when the host is busy, so no group can crowd out another.

Every request's work shares one event loop. While more requests are ready than there are slots, the waiting
group that used the host least lately (its time in a slot, decayed with a half-life of a second) starts first:
a group that floods the host queues behind itself, a light group is served almost at once. The main group is the
operator's own and is never made to wait. A slot is given back when its request ends or after `hold_s`, so a
slow request (an HA call, a screenshot) never holds others back; only its time in the slot is charged.

The hold time is only watched while a group waits: an uncontended turn arms no timer (the quiet path's cost).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

SLOTS = 4
HOLD_S = 0.025
HALF_LIFE_S = 1.0


@dataclass(eq=False)
class _Slot:
    folder: str
    started: float
    released: bool = False


class FairAdmission:
    """Slots for starting requests, granted to the least-served waiting group first."""

    def __init__(
        self, *, slots: int = SLOTS, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._free = slots
        self._hold_s = hold_s
        self._clock = clock
        self._usage: dict[str, tuple[float, float]] = {}  # folder -> (seconds in slots, decayed to this time)
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # by group, oldest first
        self._held: list[_Slot] = []  # slots in use, oldest first
        self._hold_timer: asyncio.TimerHandle | None = None  # armed only while a group waits

    def usage(self, folder: str) -> float:
        """Seconds in slots the group used lately (decayed to now)."""
        value, at = self._usage.get(folder, (0.0, 0.0))
        return value * math.pow(0.5, (self._clock() - at) / HALF_LIFE_S)

    @asynccontextmanager
    async def turn(self, folder: str, *, exempt: bool = False) -> AsyncIterator[None]:
        """Hold a slot while the block runs (at most `hold_s`); an exempt group never waits for one."""
        if exempt:
            yield
            return
        await self._acquire(folder)
        slot = _Slot(folder=folder, started=self._clock())
        self._held.append(slot)
        if self._waiting:
            self._arm()
        try:
            yield
        finally:
            self._release(slot)

    async def _acquire(self, folder: str) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(folder, deque()).append(granted)
        self._arm()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._give_back()  # granted just as it was cancelled: the slot goes to the next waiter
            raise

    def _arm(self) -> None:
        """Give back the oldest held slot when its hold time ends (at once if it has already)."""
        if self._hold_timer is not None or not self._held:
            return
        delay = max(0.0, self._held[0].started + self._hold_s - self._clock())
        self._hold_timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._hold_timer = None
        now = self._clock()
        for slot in [s for s in self._held if s.started + self._hold_s <= now]:
            self._release(slot, held_until=slot.started + self._hold_s)
        if self._waiting:
            self._arm()

    def _release(self, slot: _Slot, *, held_until: float | None = None) -> None:
        if slot.released:
            return
        slot.released = True
        self._held.remove(slot)
        now = self._clock()
        spent = (now if held_until is None else min(now, held_until)) - slot.started
        self._usage[slot.folder] = (self.usage(slot.folder) + spent, now)
        self._give_back()
        if not self._waiting and self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    def _give_back(self) -> None:
        self._free += 1
        while self._free > 0 and self._waiting:
            # Judged now, not when they began to wait: usage keeps changing while a flood waits.
            folder = min(self._waiting, key=self.usage)
            queue = self._waiting[folder]
            granted = queue.popleft()
            if not queue:
                del self._waiting[folder]
            if granted.done():
                continue  # its waiter was cancelled
            self._free -= 1
            granted.set_result(None)
