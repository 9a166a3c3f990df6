"""The scheduler inside the real `farmhost run`, on the wall clock: tasks fire, pause/resume/cancel act at once.

Tasks are created through tasks/ (or committed by another process, as the CLI does). One test per schedule type
keeps the daemon's real clock tested; the service's rules are tested on a stepped clock (test_scheduler_service.py).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import (
    Daemon,
    drop,
    hold_for,
    init_data_dir_in_process,
    ok,
    once_time,
    round_trip,
    wait_for,
    wait_result,
)
from scheduler_support import grid, insert, new_task, read_task, rows

SECOND = timedelta(seconds=1)
_ids = itertools.count()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon for the module; every test uses its own task ids."""
    root = init_data_dir_in_process(tmp_path_factory.mktemp("scheduler-daemon") / "data")
    daemon = Daemon(root).start()
    yield root
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()


def ask(data_dir: Path, folder: str, payload: dict[str, Any]) -> dict[str, Any]:
    rid = f"sched-{next(_ids)}"
    drop(data_dir, folder, "tasks", {**payload, "requestId": rid})
    result: dict[str, Any] = ok(wait_result(data_dir, folder, rid))
    return result


def schedule(data_dir: Path, task_id: str, schedule_type: str, value: str | int) -> dict[str, Any]:
    payload = {"type": "schedule_task", "prompt": "check the water tank", "schedule_type": schedule_type}
    return ask(data_dir, "field", {**payload, "schedule_value": value, "taskId": task_id})


def snapshot(data_dir: Path, folder: str) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in json.loads((data_dir / "ipc" / folder / "current_tasks.json").read_text())}


def finished(data_dir: Path, task_id: str) -> list[Any]:
    return [r for r in rows(data_dir, task_id) if r.finished_at is not None]


def test_tasks_created_through_ipc_fire_on_time_and_every_run_is_logged(farm: Path) -> None:
    first = datetime.fromisoformat(schedule(farm, "tank", "interval", 1000)["nextRun"])
    # Still ahead when the daemon handles the request (a once time already past is refused): by a round trip timed
    # now, not by a fixed 2 s that a loaded machine's slow answer could use up.
    due = once_time(farm, "field", UTC)
    at = due.isoformat(timespec="milliseconds")
    schedule(farm, "once-tank", "once", at)
    ahead = (due - datetime.now(UTC)).total_seconds()
    wait_for(
        lambda: len(finished(farm, "tank")) >= 2 and finished(farm, "once-tank"), timeout=ahead + 4, what="the runs"
    )
    anchor = read_task(farm, "tank").anchor
    records = rows(farm, "tank")
    assert [r.due_at for r in records] == grid(anchor, SECOND, len(records)) and records[0].due_at == first
    # The agent runtime decides ok or error; either way the run was dispatched once and recorded (a due time that
    # arrives while the previous run still runs is recorded skipped).
    assert records[0].status in ("ok", "error")
    assert {r.status for r in records} <= {"ok", "error", "skipped", "running"}
    (once,) = rows(farm, "once-tank")
    assert once.status in ("ok", "error") and once.due_at == datetime.fromisoformat(at)

    # The agents see what the scheduler did: current_tasks.json was rewritten after each claim.
    def completed() -> dict[str, dict[str, Any]] | None:
        tasks = snapshot(farm, "field")
        return tasks if tasks["once-tank"]["status"] == "completed" else None

    tasks = wait_for(completed, what="the once task completed in current_tasks.json")
    assert tasks["once-tank"]["next_run"] is None and tasks["once-tank"]["last_run"] is not None
    assert tasks["tank"]["last_run"] is not None and datetime.fromisoformat(tasks["tank"]["next_run"]) > first
    ask(farm, "field", {"type": "cancel_task", "taskId": "tank"})


def test_pause_resume_and_cancel_take_effect_at_once(farm: Path) -> None:
    schedule(farm, "paused", "interval", 1000)
    schedule(farm, "cancelled", "interval", 1000)
    schedule(farm, "witness", "interval", 1000)  # keeps firing: its runs show the due times that passed
    wait_for(lambda: rows(farm, "paused") and rows(farm, "cancelled"), timeout=5, what="the first runs")
    assert ask(farm, "field", {"type": "pause_task", "taskId": "paused"})["status"] == "paused"
    assert ask(farm, "field", {"type": "cancel_task", "taskId": "cancelled"})["status"] == "cancelled"
    paused, cancelled, witnessed = len(rows(farm, "paused")), len(rows(farm, "cancelled")), len(rows(farm, "witness"))
    # Three due times of each pass: the witness, on the same 1 s interval, was claimed four more times meanwhile.
    wait_for(lambda: len(rows(farm, "witness")) >= witnessed + 4, timeout=8, what="four more due times of the witness")
    assert (len(rows(farm, "paused")), len(rows(farm, "cancelled"))) == (paused, cancelled)
    resumed = datetime.fromisoformat(ask(farm, "field", {"type": "resume_task", "taskId": "paused"})["nextRun"])
    wait_for(lambda: len(rows(farm, "paused")) > paused, timeout=3, what="a run after resume")
    anchor = read_task(farm, "paused").anchor
    assert rows(farm, "paused")[paused].due_at == resumed and (resumed - anchor) % SECOND == timedelta(0)
    assert len(rows(farm, "cancelled")) == cancelled and "cancelled" not in snapshot(farm, "field")
    ask(farm, "field", {"type": "cancel_task", "taskId": "paused"})
    ask(farm, "field", {"type": "cancel_task", "taskId": "witness"})


def test_a_cron_task_fires_at_its_due_time_and_moves_to_its_next_cron_time(farm: Path) -> None:
    # A cron time is at least a minute away: the task is committed by another process (as the CLI would) with its
    # next_run seconds ahead, so the wall clock brings it due soon; the next one comes from the cron expression.
    ahead = timedelta(seconds=hold_for(round_trip(farm, "field"), least=1))  # the daemon sees the commit before it
    now = datetime.now(UTC)
    due = now + ahead
    (task,) = insert(farm, new_task("cron-tank", "cron", "*/5 * * * *", now=now, next_run=due))
    assert task.next_run is not None
    wait_for(lambda: finished(farm, "cron-tank"), timeout=10, what="the cron task's run to end")
    (record,) = rows(farm, "cron-tank")
    assert record.due_at == task.next_run and record.claimed_at >= record.due_at
    assert record.status in ("ok", "error")
    next_run = read_task(farm, "cron-tank").next_run
    assert next_run is not None and record.claimed_at < next_run <= record.claimed_at + timedelta(minutes=5)
    assert (next_run.minute % 5, next_run.second, next_run.microsecond) == (0, 0, 0)
    ask(farm, "field", {"type": "cancel_task", "taskId": "cron-tank"})
