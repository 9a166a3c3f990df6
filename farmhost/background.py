"""The daemon's background tasks: a periodic tick that outlives its own failures, and a stop that waits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)


async def every(seconds: float, tick: Callable[[], None | Awaitable[None]], *, first_now: bool = False) -> None:
    """Call `tick` every `seconds` (at once first with `first_now`) until cancelled; a failing tick is logged."""
    if not first_now:
        await asyncio.sleep(seconds)
    while True:
        try:
            pending = tick()
            if pending is not None:
                await pending
        except Exception:  # one bad round must not end the service for the life of the daemon
            logger.exception("periodic %s failed; trying again in %g s", getattr(tick, "__qualname__", tick), seconds)
        await asyncio.sleep(seconds)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
