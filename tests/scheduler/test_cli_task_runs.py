"""`farmhost task runs TASK_ID` and the last-run column of `task list`, on a database the real scheduler filled."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import farmhost, init_data_dir_in_process
from scheduler_support import Clock, Recorder, insert, new_task, scheduler, utc

from farmhost.scheduler import claims
from farmhost.scheduler.runs import RunReport, TaskRun
from farmhost.store.db import Database

HOUR = timedelta(hours=1)
BASE = utc(2031, 6, 1, 6, 0)  # years ahead: only the injected clock makes these tasks due
LONG_ERROR = "the pump controller did not answer.\nTried twice over Modbus, both timed out " + "x" * 600


async def _fill(root: Path) -> None:
    clock = Clock(BASE)
    outcomes = [
        RunReport(status="ok", summary="Tank at 80 %, pump off."),
        RunReport(status="error", summary=LONG_ERROR),
    ]

    def report(run: TaskRun) -> RunReport:
        clock.set(clock.now() + timedelta(seconds=42))  # the run takes 42 s by the clock
        return outcomes.pop(0)

    insert(
        root,
        new_task("pump", "interval", "3600000", now=BASE),
        new_task("idle", "cron", "0 5 * * *", now=BASE, folder="main"),
    )
    async with scheduler(root, dispatch=Recorder(report=report), clock=clock) as h:
        for hours in (1, 2, 4):  # the third is 1 h late: beyond the 15 min grace
            clock.set(BASE + hours * HOUR)
            await h.service.run_due()
    db = Database.open(root)  # a claim whose host died before the run reported
    with db.tx() as conn:
        claim = claims.claim_due(conn, task_id="pump", due_at=BASE + 5 * HOUR, now=BASE + 5 * HOUR, zone=UTC, grace=900)
    db.close()
    assert claim.run is not None


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Task `pump`: ok (42 s), error (long), skipped (missed), then claimed and still running; `idle`: no runs."""
    root = init_data_dir_in_process(tmp_path_factory.mktemp("cli-runs") / "data")
    asyncio.run(_fill(root))
    return root


def run_json(*args: str, data_dir: Path) -> Any:
    done = farmhost(*args, "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stamp(hours: int) -> str:
    return (BASE + hours * HOUR).isoformat(timespec="milliseconds")


def test_task_runs_json_lists_every_due_time_with_status_duration_and_summary(data_dir: Path) -> None:
    ok_run, error_run, skipped, running = run_json("task", "runs", "pump", data_dir=data_dir)
    assert ok_run == {
        "id": ok_run["id"],
        "taskId": "pump",
        "dueAt": stamp(1),
        "claimedAt": stamp(1),
        "finishedAt": (BASE + HOUR + timedelta(seconds=42)).isoformat(timespec="milliseconds"),
        "status": "ok",
        "durationSeconds": 42.0,
        "summary": "Tank at 80 %, pump off.",
    }
    assert (error_run["dueAt"], error_run["status"]) == (stamp(2), "error")
    assert len(error_run["summary"]) == 500 and error_run["summary"].endswith("…")  # trimmed when stored
    assert error_run["summary"].startswith("the pump controller did not answer.\nTried twice")
    assert (skipped["dueAt"], skipped["status"], skipped["durationSeconds"]) == (stamp(3), "skipped", 0.0)
    assert "more than the 900 s grace" in skipped["summary"]
    assert (running["dueAt"], running["status"], running["finishedAt"], running["durationSeconds"]) == (
        stamp(5),
        "running",
        None,
        None,
    )
    assert run_json("task", "runs", "pump", "--limit", "2", data_dir=data_dir) == [skipped, running]
    assert run_json("task", "runs", "idle", data_dir=data_dir) == []


def test_task_runs_text_shows_due_status_duration_and_a_one_line_summary(data_dir: Path) -> None:
    done = farmhost("task", "runs", "pump", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    header, columns, *lines = done.stdout.splitlines()
    assert header == f"task pump (group field, interval 3600000, active; next run {stamp(6)})"
    assert columns.split() == ["DUE", "STATUS", "DURATION", "SUMMARY"]
    assert len(lines) == 4
    assert lines[0].startswith(stamp(1)) and "ok" in lines[0] and "42.0 s" in lines[0] and "Tank at 80 %" in lines[0]
    assert "error" in lines[1] and "did not answer. Tried twice" in lines[1] and lines[1].endswith("…")
    assert stamp(3) in lines[2] and "skipped" in lines[2] and " - " in lines[2] and "missed" in lines[2]
    assert stamp(5) in lines[3] and lines[3].split()[1:3] == ["running", "running"]
    idle = farmhost("task", "runs", "idle", data_dir=data_dir)
    assert idle.returncode == 0 and idle.stdout.splitlines()[1] == "no runs yet"


def test_unknown_task_or_bad_limit_is_a_clear_error(data_dir: Path) -> None:
    done = farmhost("task", "runs", "no-such-task", data_dir=data_dir)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "farmhost: error: no task with id 'no-such-task'; `farmhost task list --all` shows every task"
    )
    bad = farmhost("task", "runs", "pump", "--limit", "0", data_dir=data_dir)
    assert bad.returncode == 2 and "--limit must be at least 1, got 0" in bad.stderr


def test_task_list_shows_each_tasks_last_run_status(data_dir: Path) -> None:
    listed = {t["id"]: t for t in run_json("task", "list", data_dir=data_dir)}
    assert (listed["pump"]["lastRunStatus"], listed["idle"]["lastRunStatus"]) == ("running", None)
    text = farmhost("task", "list", data_dir=data_dir).stdout.splitlines()
    assert "LAST RUN" in text[0]
    (pump,) = [line for line in text if line.startswith("pump ")]
    (idle,) = [line for line in text if line.startswith("idle ")]
    assert pump.split()[-4] == "running" and idle.split()[-4] == "-"  # before the prompt "prompt of <id>"
