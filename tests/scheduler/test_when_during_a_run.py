"""A when event that comes while the task's previous run is still running waits for that run, and then runs.

The real SchedulerService and WhenWatcher on one database, on a hand-stepped clock; the dispatcher holds the first
run until the test lets it end. One waiting event per task: a later one takes its place and says how many it
stands for; the cooldown still applies; the waiting event survives a restart like any due run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler_support import Clock, Harness, Recorder, insert, looked, new_task, rows, scheduler, until

from farmhost.farm.homeassistant.live_view import Context, EntityView, StateChange
from farmhost.scheduler.runs import TaskRun
from farmhost.scheduler.watcher import WhenWatcher, event_prompt
from farmhost.store import when_state

SOIL = "sensor.field_2_soil_moisture"
T0 = datetime(2026, 6, 1, 6, 0, tzinfo=UTC)
TASK = "w-slow"


@dataclass
class Farm:
    """The scheduler, the watcher and the soil sensor it follows."""

    clock: Clock
    h: Harness
    watcher: WhenWatcher
    release: asyncio.Event  # ends the first run
    value: str = "38.0"

    async def soil(self, value: float, *, after: float) -> datetime:
        """The sensor changes `after` seconds from now (seen live); returns when."""
        moment = self.clock.advance(after)
        old, self.value = self.value, f"{value:.1f}"
        self.watcher._changed(
            StateChange(
                entity_id=SOIL,
                old=EntityView(entity_id=SOIL, state=old),
                new=EntityView(entity_id=SOIL, state=self.value, last_changed=moment),
                context=Context(id=""),
                agents=False,
                seen_at=0.0,
                resync=False,
            )
        )
        await asyncio.sleep(0)  # the watcher wakes the scheduler soon after an edge
        return moment

    async def cross_twice(self, gap: float) -> tuple[datetime, datetime]:
        """20 % (its run starts, held), 38 % a second later, 20 % again `gap` s after that; returns both crossings."""
        first = await self.soil(20, after=1)
        await self.runs(1)
        await self.soil(38, after=1)
        return first, await self.soil(20, after=gap)

    def event(self, run: TaskRun) -> dict[str, Any] | None:
        return when_state.event_for(self.h.db.conn, TASK, run.due_at)

    async def runs(self, count: int) -> list[TaskRun]:
        await until(lambda: len(self.h.dispatch.runs) >= count, what=f"{count} run(s) dispatched")
        return self.h.dispatch.runs


@asynccontextmanager
async def farm(data_dir: Path, *, start: datetime = T0, insert_task: bool = True) -> AsyncIterator[Farm]:
    clock = Clock(start)
    if insert_task:
        insert(data_dir, new_task(TASK, "when", {"entity": SOIL, "below": 30, "cooldown": 5}, now=start))
    release = asyncio.Event()
    recorder = Recorder(hold=lambda run: release.wait() if run is recorder.runs[0] and insert_task else None)
    async with scheduler(data_dir, dispatch=recorder, clock=clock) as h:
        watcher = WhenWatcher(db=h.db, zone=UTC, view=None, wake=h.service.sync, clock=clock.now)
        watcher.refresh()
        f = Farm(clock=clock, h=h, watcher=watcher, release=release)
        if insert_task:  # the first look: 38 % is not below 30, the baseline
            watcher._changed(
                StateChange(
                    entity_id=SOIL,
                    old=None,
                    new=EntityView(entity_id=SOIL, state="38.0", last_changed=start),
                    context=Context(id=""),
                    agents=False,
                    seen_at=0.0,
                    resync=True,
                )
            )
        yield f


async def test_an_event_while_the_run_still_runs_runs_when_it_ends(data_dir: Path) -> None:
    """The red-team's case: 38 -> 20 (runs, for 14 s), back to 38, 20 again 7 s later (past the 5 s cooldown)."""
    async with farm(data_dir) as f:
        first_at, second_at = await f.cross_twice(6)
        f.clock.advance(7)  # the first run has run 14 s
        f.release.set()
        first, second = await f.runs(2)
        event = f.event(second)
    assert first.due_at == first_at and second.due_at == f.clock.now()  # on time: when the first ended
    assert event is not None and event["new"] == "20.0" and event["at"] == second_at.isoformat()
    assert [(r.due_at, r.status) for r in rows(data_dir, TASK)] == [(first_at, "ok"), (f.clock.now(), "ok")]


async def test_one_event_waits_the_latest_and_it_says_how_many_it_stands_for(data_dir: Path) -> None:
    async with farm(data_dir) as f:
        _, superseded = await f.cross_twice(5)
        await f.soil(38, after=1)
        latest = await f.soil(25, after=5)
        f.clock.advance(3)
        f.release.set()
        _, second = await f.runs(2)
        await until(lambda: f.h.service._inflight == {}, what="the second run to end")
        event = f.event(second)
    assert event is not None and event["new"] == "25.0" and event["at"] == latest.isoformat()
    assert event["folded"] == 1
    assert "1 earlier event" in event_prompt(event, "sensor below 30")
    statuses = [(r.due_at, r.status) for r in rows(data_dir, TASK)]
    assert statuses == [(T0 + timedelta(seconds=1), "ok"), (superseded, "skipped"), (f.clock.now(), "ok")]
    assert "folded into the event" in (rows(data_dir, TASK)[1].detail or "")


async def test_an_event_within_the_cooldown_during_a_run_is_still_skipped(data_dir: Path) -> None:
    async with farm(data_dir) as f:
        _, within = await f.cross_twice(2)  # 3 s after the first: inside the 5 s cooldown
        f.clock.advance(10)
        f.release.set()
        await until(lambda: f.h.service._inflight == {}, what="the first run to end")
        f.clock.advance(0)
        await looked(f.clock)  # the scheduler has claimed whatever was due
        assert len(f.h.dispatch.runs) == 1
    assert [r.status for r in rows(data_dir, TASK)] == ["ok", "skipped"]
    assert rows(data_dir, TASK)[1].due_at == within and "cooldown" in (rows(data_dir, TASK)[1].detail or "")


async def test_a_waiting_event_survives_a_restart_and_runs_within_the_grace(data_dir: Path) -> None:
    async with farm(data_dir) as f:
        _, waiting = await f.cross_twice(5)
        stopped_at = f.clock.advance(2)  # the host stops during the first run: it is interrupted
    async with farm(data_dir, start=stopped_at + timedelta(seconds=30), insert_task=False) as g:
        (run,) = await g.runs(1)
        event = g.event(run)
    assert run.due_at == waiting and event is not None and event["at"] == waiting.isoformat()
    assert [r.status for r in rows(data_dir, TASK)] == ["interrupted", "ok"]
