"""DiskWatch: a run's disk while it goes on: the host's free space and the group's limit, ending the run over either.

Before each run the host measures what the group holds (group_disk.py); nothing in the kernel holds a directory's
size here (project quotas and loop images need root-only tooling), so a run once wrote into /workspace/group
until its wall time (600 s) and filled the disk the database and Home Assistant share. While a run goes on:

- about every second, `statvfs` of the filesystems its writable mounts are on (O(1)): under the disk reserve
  (FARMHOST_DISK_RESERVE_MB) the run is ended, whatever its group holds;
- the bounded walk of group_disk.py again, in a thread, every WALK_EVERY seconds and at least WALK_COST times
  the last walk's duration apart (so a big tree costs at most about 5% of a core), and sooner when the free space
  fell by more than the room the group had left at the last walk (the group may have passed its limit): over
  it, the run is ended naming the heaviest entries.

Nothing of it exists while no run goes on: an idle daemon does not wake for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.base import SandboxSpec
from farmhost.agents.sandbox.group_disk import DiskLimit, OverLimit, check_group_sync, writable_roots

logger = logging.getLogger(__name__)

# How often the free space is read.
TICK: Final = 1.0
# The walk's interval, and its least multiple of the last walk's duration (1/20: at most ~5% of a core).
WALK_EVERY: Final = 5.0
WALK_COST: Final = 20.0

End = Callable[[str], None]


class DiskWatch:
    """Watches one run's writable mounts until it is cancelled or has ended the run (`end` called once)."""

    def __init__(
        self, spec: SandboxSpec, *, reserve_mb: int, end: End, tick: float = TICK, walk_every: float = WALK_EVERY
    ) -> None:
        """`reserve_mb` 0: no reserve. `end(reason)` ends the run (SIGTERM, then SIGKILL)."""
        self._spec = spec
        self._run_id = spec.run_id
        self._roots = writable_roots(spec)
        self._limit = DiskLimit.of_workspace_mb(spec.limits.workspace_mb)
        self._reserve = reserve_mb * 2**20
        self._reserve_mb = reserve_mb
        self._end = end
        self._tick = tick
        self._walk_every = walk_every

    async def run(self) -> None:
        """Watch until cancelled or the run is ended."""
        walk: asyncio.Task[tuple[int, float]] | None = None
        last_walk = time.monotonic()
        cost = 0.0  # how long the last walk took
        room = 0  # bytes the group had left under its limit at the last walk (none known before the first)
        free_at_walk = free_then = self._free()
        try:
            while True:
                free = self._free()
                if (low := self._low(free)) is not None:
                    self._end(low)
                    return
                now = time.monotonic()
                if walk is not None and walk.done():
                    try:
                        room, cost = walk.result()
                    except OverLimit as err:
                        self._end(f"the run was ended: {err.message}")
                        return
                    except OSError as err:  # the watch of the free space goes on; the next walk may succeed
                        logger.warning("run %s: cannot measure its group's disk: %s", self._run_id, err)
                        cost = max(cost, self._walk_every / WALK_COST)  # not again at the next tick
                    walk, last_walk, free_at_walk = None, now, free_then
                if walk is None:
                    wait = WALK_COST * cost
                    if _fell(free_at_walk, free) <= room:  # the group cannot have passed its limit yet
                        wait = max(wait, self._walk_every)
                    if now - last_walk >= wait:
                        free_then = free
                        walk = asyncio.create_task(asyncio.to_thread(self._walk_sync), name="disk:walk")
                if walk is None:
                    await asyncio.sleep(self._tick)
                else:  # its result at once, not a tick later
                    await asyncio.wait({walk}, timeout=self._tick)
        finally:
            if walk is not None:
                walk.cancel()  # its thread ends its bounded walk; nobody waits for it

    def _walk_sync(self) -> tuple[int, float]:
        """The room the group has left under its limit, and how long the walk took.

        Raises:
            OverLimit: the group is over its limit (naming the heaviest entries).
        """
        began = time.monotonic()
        use = check_group_sync(self._spec)
        took = time.monotonic() - began
        logger.debug("run %s: its group holds %d MiB of %d MiB (walked in %.3f s)", self._run_id,
                     use.bytes // 2**20, self._limit.bytes // 2**20, took)  # fmt: skip
        return self._limit.bytes - use.bytes, took

    def _free(self) -> dict[int, tuple[int, str]]:
        """Each filesystem the mounts are on: its bytes free to an unprivileged writer, and a mount on it."""
        free: dict[int, tuple[int, str]] = {}
        for label, root in self._roots.items():
            try:
                device = os.stat(root).st_dev
                if device not in free:
                    info = os.statvfs(root)
                    free[device] = (info.f_bavail * info.f_frsize, label)
            except OSError:  # gone (nothing to watch there) or unreadable (the next tick tries again)
                continue
        return free

    def _low(self, free: dict[int, tuple[int, str]]) -> str | None:
        if not self._reserve:
            return None
        for left, label in free.values():
            if left < self._reserve:
                return (
                    f"the run was ended: the disk holding the data directory ({_parent(label)}) has only "
                    f"{left // 2**20} MB free (reserve {self._reserve_mb} MB, FARMHOST_DISK_RESERVE_MB)"
                )
        return None


def _fell(before: dict[int, tuple[int, str]], now: dict[int, tuple[int, str]]) -> int:
    """By how many bytes the free space fell on the filesystems of both readings, in all."""
    return sum(max(0, before[device][0] - left) for device, (left, _) in now.items() if device in before)


def _parent(label: str) -> str:
    """The data directory a mount's source lies in (`<data>/groups/field` -> `<data>`)."""
    path = Path(label)
    return str(path.parent.parent if path.parent.name in ("groups", "ipc") else path.parent)
