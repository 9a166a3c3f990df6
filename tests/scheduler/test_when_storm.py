"""A state storm on a watched entity: the cost per change and the records it leaves are bounded.

The real SchedulerService and WhenWatcher on one database, on a hand-stepped clock. A binary sensor flaps (a
chattering relay, a door sensor with a loose magnet) under a group's 100 `when` tasks, the per-group limit: each
change is one transaction whatever the number of tasks, and a task's cooldown leaves one `skipped` row, not one
per crossing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from scheduler_support import Clock, insert, new_task, rows, scheduler, until

from farmhost.farm.homeassistant.live_view import Context, EntityView, StateChange
from farmhost.scheduler.watcher import WhenWatcher
from farmhost.store.db import Database

DOOR = "binary_sensor.barn_door"
T0 = datetime(2026, 6, 1, 6, 0, tzinfo=UTC)


class Door:
    """Feeds the watcher the door's changes as the live view does (seen live)."""

    def __init__(self, watcher: WhenWatcher, clock: Clock) -> None:
        self.watcher, self.clock, self.state = watcher, clock, "off"
        self.watcher._changed(self._change("off", old=None, resync=True))  # the first look: closed

    def _change(self, state: str, *, old: str | None, resync: bool = False) -> StateChange:
        return StateChange(
            entity_id=DOOR,
            old=EntityView(entity_id=DOOR, state=old) if old is not None else None,
            new=EntityView(entity_id=DOOR, state=state, last_changed=self.clock.now()),
            context=Context(id=""),
            agents=False,
            seen_at=0.0,
            resync=resync,
        )

    def flip(self, *, after: float) -> None:
        self.clock.advance(after)
        new = "on" if self.state == "off" else "off"
        self.watcher._changed(self._change(new, old=self.state))
        self.state = new


@contextmanager
def commits(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []
    db.conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)


async def test_a_flap_under_a_groups_hundred_tasks_costs_one_transaction_per_change(data_dir: Path) -> None:
    ids = [f"door-{i}" for i in range(100)]
    insert(data_dir, *[new_task(i, "when", {"entity": DOOR, "state": "on", "cooldown": 5}, now=T0) for i in ids])
    clock = Clock(T0)
    async with scheduler(data_dir, clock=clock) as h:
        watcher = WhenWatcher(db=h.db, zone=UTC, view=None, wake=h.service.sync, clock=clock.now)
        watcher.refresh()
        door = Door(watcher, clock)
        with commits(h.db) as seen:
            for _ in range(20):
                door.flip(after=0.01)
        assert len(seen) == 20  # one per change, not one per task and change (2,000)
        await until(lambda: len(h.dispatch.runs) == 100, what="each task's run of the first opening")
        await asyncio.sleep(0)
    assert {run.task.id for run in h.dispatch.runs} == set(ids)


async def test_a_flapping_sensor_leaves_one_cooldown_row_per_cooldown_not_one_per_crossing(data_dir: Path) -> None:
    insert(data_dir, new_task("door", "when", {"entity": DOOR, "state": "on", "cooldown": 60}, now=T0))
    clock = Clock(T0)
    async with scheduler(data_dir, clock=clock) as h:
        watcher = WhenWatcher(db=h.db, zone=UTC, view=None, wake=h.service.sync, clock=clock.now)
        watcher.refresh()
        door = Door(watcher, clock)
        for _ in range(200):  # 100 openings within 20 s: the first runs, the rest fall in its cooldown
            door.flip(after=0.1)
        await until(lambda: len(h.dispatch.runs) == 1, what="the first opening's run")
        clock.advance(60)
        for _ in range(20):  # past the cooldown: the next opening runs again, the ones after it are its cooldown's
            door.flip(after=0.1)
        await until(lambda: len(h.dispatch.runs) == 2, what="the run of the first opening past the cooldown")
        await until(lambda: h.service._inflight == {}, what="the runs to end")
    statuses = [r.status for r in rows(data_dir, "door")]
    assert statuses == ["ok", "skipped", "ok", "skipped"]
    assert all("not recorded one by one" in (r.detail or "") for r in rows(data_dir, "door") if r.status == "skipped")
