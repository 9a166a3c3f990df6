"""FairAdmission: a group that floods the host waits behind itself; a light group and main are served first."""

from __future__ import annotations

import asyncio
import math

import pytest

from farmhost.ipc.admission import HALF_LIFE_S, FairAdmission


async def _work(admission: FairAdmission, folder: str, order: list[str], seconds: float = 0.002, *,
                exempt: bool = False) -> None:  # fmt: skip
    async with admission.turn(folder, exempt=exempt):
        order.append(folder)
        await asyncio.sleep(seconds)


async def test_a_light_group_goes_before_a_flood_that_came_first() -> None:
    admission = FairAdmission(slots=1)
    order: list[str] = []
    flood = [asyncio.create_task(_work(admission, "flood", order)) for _ in range(200)]
    while len(order) < 3:  # the flood has used the host for a while, and nearly all of it is waiting
        await asyncio.sleep(0.001)
    started = len(order)
    await _work(admission, "light", order)
    assert order.index("light") <= started + 1, order  # after the flood's request in progress, not its queue
    await asyncio.gather(*flood)
    assert order.count("flood") == 200


class _Clock:
    """Time that passes only as the work says: a loaded machine's stalls are nobody's usage."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _timed_work(admission: FairAdmission, clock: _Clock, folder: str, order: list[str], seconds: float) -> None:
    async with admission.turn(folder):
        order.append(folder)
        clock.now += seconds
        await asyncio.sleep(0.002)


async def test_the_group_that_used_the_host_least_lately_goes_first() -> None:
    clock = _Clock()
    admission = FairAdmission(slots=1, hold_s=60, clock=clock)
    order: list[str] = []
    for _ in range(5):
        await _timed_work(admission, clock, "heavy", order, 0.002)
    await _timed_work(admission, clock, "medium", order, 0.002)
    assert admission.usage("heavy") > admission.usage("medium") > admission.usage("fresh") == 0
    blocker = asyncio.create_task(_timed_work(admission, clock, "blocker", order, 0.02))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(_timed_work(admission, clock, folder, order, 0.002))
        for folder in ("heavy", "medium", "fresh")
    ]
    await asyncio.gather(blocker, *waiting)
    assert order[-3:] == ["fresh", "medium", "heavy"], order


async def test_main_never_waits_for_a_slot() -> None:
    admission = FairAdmission(slots=1, hold_s=10)
    order: list[str] = []
    slow = asyncio.create_task(_work(admission, "field", order, 0.5))
    await asyncio.sleep(0)
    await _work(admission, "main", order, 0, exempt=True)
    assert order == ["field", "main"] and not slow.done(), "main went while field held the only slot"
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)


async def test_a_slow_request_gives_its_slot_back_after_the_hold_time() -> None:
    clock = _Clock()
    admission = FairAdmission(slots=1, hold_s=0.02, clock=clock)
    order: list[str] = []
    slow = asyncio.create_task(_work(admission, "camera", order, 5))  # a screenshot, an HA restart
    await asyncio.sleep(0)
    clock.now = 0.05  # past the hold time while it still works
    await asyncio.wait_for(_work(admission, "field", order), timeout=2)
    assert order == ["camera", "field"]
    clock.now = 5.0
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)
    charged = 0.02 * math.pow(0.5, (5.0 - 0.05) / HALF_LIFE_S)  # its 20 ms in the slot, decayed since given back
    assert admission.usage("camera") == pytest.approx(charged), "only its time in the slot is charged, not its 5 s"


async def test_a_cancelled_waiter_does_not_lose_a_slot() -> None:
    admission = FairAdmission(slots=1)
    order: list[str] = []
    holder = asyncio.create_task(_work(admission, "a", order, 0.01))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(_work(admission, "b", order))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(holder, cancelled, return_exceptions=True)
    for folder in ("c", "d", "e"):  # each would wait forever if the slot had been lost
        await asyncio.wait_for(_work(admission, folder, order), timeout=2)
    assert order == ["a", "c", "d", "e"]
