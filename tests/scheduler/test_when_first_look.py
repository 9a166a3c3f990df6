"""A when task's first look at its entity: when a state already true is its start, and when it is an edge."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scheduler_support import insert, new_task, read_task

from farmhost.farm.homeassistant.live_view import Context, EntityView, StateChange
from farmhost.scheduler.watcher import WhenWatcher
from farmhost.store.db import Database

SOIL = "sensor.field_1_soil_moisture"
CREATED = datetime(2026, 6, 1, 6, 0, tzinfo=UTC)


async def first_sight(data_dir: Path, *, changed_at: datetime) -> tuple[int, int, datetime | None]:
    """The watcher sees the soil at 20 % for the first time (after a reconnect, nothing seen before): what follows."""
    (task,) = insert(data_dir, new_task("w-first", "when", {"entity": SOIL, "below": 25}, now=CREATED))
    woken: list[int] = []
    db = Database.open(data_dir)
    try:
        watcher = WhenWatcher(
            db=db, zone=UTC, view=None, wake=lambda: woken.append(1), clock=lambda: CREATED + timedelta(minutes=1)
        )
        watcher.refresh()
        seen = EntityView(entity_id=SOIL, state="20.0", last_changed=changed_at)
        watcher._changed(
            StateChange(
                entity_id=SOIL, old=None, new=seen, context=Context(id=""), agents=False, seen_at=0, resync=True
            )
        )
        await asyncio.sleep(0)  # the wake is called soon after the edge, on the loop
        await asyncio.sleep(0)
    finally:
        db.close()
    return watcher.edges, len(woken), read_task(data_dir, task.id).next_run


async def test_a_change_after_the_task_was_created_is_its_first_edge(data_dir: Path) -> None:
    """HA dates the drop after the task's creation: it happened under the task's watch, while the view was away."""
    edges, woken, next_run = await first_sight(data_dir, changed_at=CREATED + timedelta(seconds=20))
    assert (edges, woken) == (1, 1)
    assert next_run == CREATED + timedelta(seconds=20)


async def test_a_state_true_since_before_the_task_is_its_start_not_an_edge(data_dir: Path) -> None:
    """Dry since before the task existed: the task waits for the next crossing."""
    edges, woken, next_run = await first_sight(data_dir, changed_at=CREATED - timedelta(hours=2))
    assert (edges, woken, next_run) == (0, 0, None)
