"""RunQueue: one run per group at a time, a global cap, and a per-group order (scheduled before chat, then FIFO)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

SCHEDULED: Final = 0
CHAT: Final = 1


class QueueClosed(Exception):
    """The queue was closed before the job got its turn."""


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    wake: asyncio.Event = field(compare=False, default_factory=asyncio.Event)
    granted: bool = field(compare=False, default=False)


class RunQueue:
    """Hands out turns: a group's next job runs when the group is free and a global slot is free."""

    def __init__(self, max_running: int) -> None:
        self._slots = asyncio.Semaphore(max_running)
        self._waiting: dict[str, list[_Waiter]] = {}
        self._busy: set[str] = set()
        self._seq = itertools.count()
        self._closed = False

    @asynccontextmanager
    async def turn(self, folder: str, priority: int) -> AsyncIterator[None]:
        """Wait for `folder`'s turn (lower priority first, FIFO within one) and hold it for the block.

        Raises:
            QueueClosed: `close()` was called before the turn came.
        """
        if self._closed:
            raise QueueClosed
        waiter = _Waiter(priority, next(self._seq))
        heapq.heappush(self._waiting.setdefault(folder, []), waiter)
        self._advance(folder)
        try:
            await waiter.wake.wait()
            if not waiter.granted:
                raise QueueClosed
            async with self._slots:
                if self._closed:
                    raise QueueClosed
                yield
        finally:
            if waiter.granted:
                self._busy.discard(folder)
                self._advance(folder)
            else:
                self._forget(folder, waiter)

    def queued(self, folder: str) -> int:
        """How many jobs of `folder` wait for their turn."""
        return len(self._waiting.get(folder, ()))

    def close(self) -> None:
        """Refuse new turns and release every waiter with QueueClosed; turns being held run on."""
        self._closed = True
        for heap in self._waiting.values():
            for waiter in heap:
                waiter.wake.set()
            heap.clear()

    def _advance(self, folder: str) -> None:
        heap = self._waiting.get(folder)
        if self._closed or folder in self._busy or not heap:
            return
        waiter = heapq.heappop(heap)
        waiter.granted = True
        self._busy.add(folder)
        waiter.wake.set()

    def _forget(self, folder: str, waiter: _Waiter) -> None:
        heap = self._waiting.get(folder, [])
        if waiter in heap:
            heap.remove(waiter)
            heapq.heapify(heap)
