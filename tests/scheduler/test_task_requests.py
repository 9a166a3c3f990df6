"""tasks/ handlers through the real daemon and real files: schedule, pause, resume, cancel, current_tasks.json."""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import clean_env, drop, hold_for, init_data_dir, round_trip, running_daemon, wait_for, wait_result

FARM_TZ = ZoneInfo("Europe/Lisbon")
_ids = itertools.count()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One daemon in the farm's zone (Europe/Lisbon) for the whole module; every test uses its own ids."""
    root = init_data_dir(tmp_path_factory.mktemp("scheduler") / "data")
    with running_daemon(root, env=clean_env(TZ="Europe/Lisbon")):
        yield root


def ask(data_dir: Path, folder: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Drop a tasks/ request with a fresh requestId and return its result."""
    rid = f"req-{next(_ids)}"
    drop(data_dir, folder, "tasks", {**payload, "requestId": rid})
    return wait_result(data_dir, folder, rid)


def schedule(
    data_dir: Path, folder: str, schedule_type: str, value: str | int | dict[str, Any], **extra: Any
) -> dict[str, Any]:
    payload = {"type": "schedule_task", "prompt": "check the water tank", "schedule_type": schedule_type}
    return ask(data_dir, folder, {**payload, "schedule_value": value, **extra})


def change(data_dir: Path, folder: str, kind: str, task_id: str) -> dict[str, Any]:
    return ask(data_dir, folder, {"type": kind, "taskId": task_id})


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert (result["status"], result["errorCode"]) == ("success", None), result
    return result["result"]  # type: ignore[no-any-return]


def failed(result: dict[str, Any], code: str) -> str:
    assert (result["status"], result["errorCode"], result["result"]) == ("error", code, None), result
    return result["error"]  # type: ignore[no-any-return]


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def snapshot(data_dir: Path, folder: str) -> dict[str, dict[str, Any]]:
    rows = json.loads((data_dir / "ipc" / folder / "current_tasks.json").read_text())
    return {row["id"]: row for row in rows}


def _next_local(now: datetime, at: time) -> datetime:
    local = now.astimezone(FARM_TZ)
    day = local.date() if local.time() < at else local.date() + timedelta(days=1)
    return datetime.combine(day, at, tzinfo=FARM_TZ).astimezone(UTC)


# schedule_task ------------------------------------------------------------------------------------


def test_cron_next_run_is_in_the_farm_zone(farm: Path) -> None:
    result = schedule(farm, "main", "cron", "30 9 * * *")
    assert when(ok(result)["nextRun"]) == _next_local(when(result["executedAt"]), time(9, 30))
    # A yearly cron: 12:00 on 1 January is 12:00 UTC in Lisbon (winter time, UTC+0).
    result = schedule(farm, "main", "cron", "0 12 1 1 *")
    now = when(result["executedAt"])
    year = now.year if now < datetime(now.year, 1, 1, 12, tzinfo=UTC) else now.year + 1
    assert when(ok(result)["nextRun"]) == datetime(year, 1, 1, 12, tzinfo=UTC)


def test_interval_first_run_is_one_interval_after_creation(farm: Path) -> None:
    for value in ("90000", 90000):  # a string or a JSON number
        result = schedule(farm, "field", "interval", value)
        assert when(ok(result)["nextRun"]) - when(result["executedAt"]) == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2030-06-01T09:00", datetime(2030, 6, 1, 8, 0, tzinfo=UTC)),  # naive: Lisbon summer time, UTC+1
        ("2030-01-15T09:00:00", datetime(2030, 1, 15, 9, 0, tzinfo=UTC)),  # naive: Lisbon winter time, UTC+0
        ("2030-06-01T09:00Z", datetime(2030, 6, 1, 9, 0, tzinfo=UTC)),
        ("2030-06-01T09:00:00+05:00", datetime(2030, 6, 1, 4, 0, tzinfo=UTC)),
        ("2030-06-01T09:00:00-03:30", datetime(2030, 6, 1, 12, 30, tzinfo=UTC)),
    ],
)
def test_once_reads_naive_times_in_the_farm_zone_and_honours_offsets(
    farm: Path, value: str, expected: datetime
) -> None:
    assert when(ok(schedule(farm, "main", "once", value))["nextRun"]) == expected


def test_context_mode_defaults_to_isolated(farm: Path) -> None:
    default = ok(schedule(farm, "field", "interval", "3600000"))["taskId"]
    grouped = ok(schedule(farm, "field", "interval", "3600000", context_mode="group"))["taskId"]
    tasks = snapshot(farm, "field")
    assert (tasks[default]["context_mode"], tasks[grouped]["context_mode"]) == ("isolated", "group")


@pytest.mark.parametrize(
    ("schedule_type", "value", "sentence"),
    [
        ("cron", "0 9 * *", "cron expression must have 5 fields (minute hour day month weekday), got 4"),
        ("cron", "0 9 * * * *", "cron expression must have 5 fields (minute hour day month weekday), got 6"),
        ("cron", "@daily", "shortcuts like @daily are not supported, write e.g. '0 0 * * *'"),
        ("cron", "61 9 * * *", "invalid cron expression '61 9 * * *'"),
        ("cron", "0 0 31 2 *", "cron expression '0 0 31 2 *' never fires: day 31 does not occur in month 2"),
        ("interval", "0", "interval must be a whole number of milliseconds > 0, got 0"),
        ("interval", "-60000", "interval must be a whole number of milliseconds such as '3600000', got '-60000'"),
        ("interval", "1h", "interval must be a whole number of milliseconds such as '3600000', got '1h'"),
        ("once", "next tuesday", "once time 'next tuesday' is not an ISO-8601 date-time"),
        ("once", "2030-06-01", "once time '2030-06-01' has no time of day"),
        ("once", "2020-06-01T09:00", "once time 2020-06-01T09:00:00+01:00 is in the past"),
        ("once", "2020-06-01T09:00Z", "is in the past"),
    ],
)
def test_invalid_schedules_say_what_is_wrong(farm: Path, schedule_type: str, value: str, sentence: str) -> None:
    before = snapshot(farm, "main")
    assert sentence in failed(schedule(farm, "main", schedule_type, value), "invalid_request")
    assert snapshot(farm, "main").keys() == before.keys()


@pytest.mark.parametrize("entity", ["sensor.tank_level\n", "\nsensor.tank_level", "sensor.tank level"])
def test_a_when_entity_that_is_not_an_entity_id_is_refused_and_not_stored(farm: Path, entity: str) -> None:
    """A trailing newline too: an id stored with one never matches a state, and the task would count for nothing."""
    before = snapshot(farm, "field")
    error = failed(schedule(farm, "field", "when", {"entity": entity, "below": 2}), "invalid_request")
    assert (
        f"schedule_value.entity must be a Home Assistant entity id such as 'sensor.field_1_soil_moisture'; got {entity!r}"
        in error
    )
    assert snapshot(farm, "field").keys() == before.keys()


def test_a_when_task_result_is_task_id_and_next_run_plus_a_warning_only_when_there_is_one(farm: Path) -> None:
    """SPEC: `{taskId, nextRun}`; what was stored is in current_tasks.json, not echoed in the result."""
    frost = ok(schedule(farm, "field", "when", {"alert": "frost"}, taskId="when-frost"))
    assert frost == {"taskId": "when-frost", "nextRun": None}
    soil = ok(schedule(farm, "field", "when", {"entity": "sensor.tank_level", "below": 2}, taskId="when-tank"))
    assert soil.keys() == {"taskId", "nextRun", "warning"}  # this daemon has no Home Assistant to ask
    assert "Home Assistant is not configured" in soil["warning"]
    stored = snapshot(farm, "field")
    assert json.loads(stored["when-frost"]["schedule_value"]) == {"alert": "frost", "cooldown": 3600}


def test_unknown_schedule_type_is_refused(farm: Path) -> None:
    assert "schedule_type" in failed(schedule(farm, "main", "weekly", "mon"), "invalid_request")


def test_task_id_conflict(farm: Path) -> None:
    assert ok(schedule(farm, "field", "interval", "3600000", taskId="pump-check"))["taskId"] == "pump-check"
    error = failed(schedule(farm, "field", "cron", "0 9 * * *", taskId="pump-check"), "conflict")
    assert "pump-check" in error
    assert snapshot(farm, "field")["pump-check"]["schedule_type"] == "interval"


def test_group_folder_targets_other_groups_only_from_main(farm: Path) -> None:
    result = ok(schedule(farm, "main", "interval", "3600000", groupFolder="field"))
    assert snapshot(farm, "field")[result["taskId"]]["groupFolder"] == "field"
    failed(schedule(farm, "field", "interval", "3600000", groupFolder="main"), "unauthorized")
    failed(schedule(farm, "main", "interval", "3600000", groupFolder="nosuch"), "not_found")


# pause / resume / cancel --------------------------------------------------------------------------


def test_pause_resume_cancel_transitions_and_errors(farm: Path) -> None:
    created = ok(schedule(farm, "field", "interval", "3600000", taskId="life-1"))
    next_run = created["nextRun"]
    assert ok(change(farm, "field", "pause_task", "life-1")) == {
        "taskId": "life-1",
        "status": "paused",
        "nextRun": next_run,
    }
    assert snapshot(farm, "field")["life-1"]["status"] == "paused"
    assert snapshot(farm, "main")["life-1"]["status"] == "paused"
    assert "already paused" in failed(change(farm, "field", "pause_task", "life-1"), "conflict")
    # A next run still in the future is kept as it was.
    assert ok(change(farm, "field", "resume_task", "life-1"))["nextRun"] == next_run
    assert snapshot(farm, "field")["life-1"]["status"] == "active"
    assert "not paused" in failed(change(farm, "field", "resume_task", "life-1"), "conflict")
    assert ok(change(farm, "field", "cancel_task", "life-1")) == {
        "taskId": "life-1",
        "status": "cancelled",
        "nextRun": None,
    }
    assert "life-1" not in snapshot(farm, "field") and "life-1" not in snapshot(farm, "main")
    for kind in ("pause_task", "resume_task", "cancel_task"):
        assert "life-1" in failed(change(farm, "field", kind, "life-1"), "not_found")
        failed(change(farm, "main", kind, "no-such-task"), "not_found")


def test_only_main_may_change_another_groups_task(farm: Path) -> None:
    ok(schedule(farm, "main", "interval", "3600000", taskId="office-1"))
    ok(schedule(farm, "field", "interval", "3600000", taskId="crew-1"))
    for kind in ("pause_task", "resume_task", "cancel_task"):
        assert "another group" in failed(change(farm, "field", kind, "office-1"), "unauthorized")
    assert snapshot(farm, "main")["office-1"]["status"] == "active"
    assert ok(change(farm, "main", "pause_task", "crew-1"))["status"] == "paused"
    assert ok(change(farm, "main", "cancel_task", "crew-1"))["status"] == "cancelled"


def test_resume_recomputes_a_next_run_in_the_past_on_the_schedules_grid(farm: Path) -> None:
    created = schedule(farm, "main", "interval", "1000", taskId="grid-1")
    anchor, first = when(created["executedAt"]), when(ok(created)["nextRun"])
    assert first - anchor == timedelta(seconds=1)
    ok(change(farm, "main", "pause_task", "grid-1"))
    wait_for(lambda: datetime.now(UTC) > first + timedelta(milliseconds=300), what="the paused task's run to pass")
    resumed = change(farm, "main", "resume_task", "grid-1")
    now, next_run = when(resumed["executedAt"]), when(ok(resumed)["nextRun"])
    assert now < next_run <= now + timedelta(seconds=1)
    assert (next_run - anchor) % timedelta(seconds=1) == timedelta(0)  # anchor + k * interval: no drift
    assert next_run - anchor >= timedelta(seconds=2)
    # The snapshot says so too (or, if the task fired meanwhile, a later time on the same grid).
    shown = when(snapshot(farm, "main")["grid-1"]["next_run"])
    assert shown >= next_run and (shown - anchor) % timedelta(seconds=1) == timedelta(0)
    ok(change(farm, "main", "cancel_task", "grid-1"))


def test_a_paused_once_task_whose_time_passed_runs_when_resumed(farm: Path) -> None:
    # Far enough ahead that scheduling and pausing (two round trips) finish before it is due, even on a busy machine.
    ahead = timedelta(seconds=hold_for(2 * round_trip(farm, "field"), least=1))  # sized by a round trip timed now
    soon = (datetime.now(FARM_TZ) + ahead).replace(tzinfo=None).isoformat(timespec="milliseconds")
    at = when(ok(schedule(farm, "field", "once", soon, taskId="once-1"))["nextRun"])
    ok(change(farm, "field", "pause_task", "once-1"))
    wait_for(lambda: datetime.now(UTC) > at, timeout=ahead.total_seconds() + 10, what="the once time to pass")
    resumed = change(farm, "field", "resume_task", "once-1")
    assert when(ok(resumed)["nextRun"]) == when(resumed["executedAt"])
    # It runs right away, and then it is completed.
    done = wait_for(lambda: (row := snapshot(farm, "field")["once-1"])["status"] == "completed" and row)
    assert done["next_run"] is None and when(done["last_run"]) >= when(resumed["executedAt"])
    assert "already completed" in failed(change(farm, "field", "cancel_task", "once-1"), "conflict")


# current_tasks.json -------------------------------------------------------------------------------


def _db_tasks(data_dir: Path, folder: str | None = None) -> set[str]:
    with closing(sqlite3.connect(f"file:{data_dir / 'farmhost.db'}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT id FROM tasks WHERE status != 'cancelled' AND (? IS NULL OR group_folder = ?)", (folder, folder)
        )
        return {row[0] for row in rows}


def test_current_tasks_snapshot_main_sees_all_others_their_own(farm: Path) -> None:
    mine = ok(schedule(farm, "main", "cron", "0 6 * * 1", taskId="snap-main", context_mode="group"))
    ok(schedule(farm, "field", "once", "2031-03-01T07:15", taskId="snap-field"))
    # Rewritten before the result is written: an agent reading it right after its result sees its change.
    main, field = snapshot(farm, "main"), snapshot(farm, "field")
    assert main.keys() == _db_tasks(farm) and {"snap-main", "snap-field"} <= main.keys()
    assert field.keys() == _db_tasks(farm, "field") and "snap-field" in field and "snap-main" not in field
    assert {row["groupFolder"] for row in field.values()} == {"field"}
    assert main["snap-main"] == {
        "id": "snap-main",
        "groupFolder": "main",
        "prompt": "check the water tank",
        "schedule_type": "cron",
        "schedule_value": "0 6 * * 1",
        "context_mode": "group",
        "status": "active",
        "next_run": mine["nextRun"],
        "last_run": None,
    }
    assert main["snap-field"] == field["snap-field"]
    assert when(field["snap-field"]["next_run"]) == datetime(2031, 3, 1, 7, 15, tzinfo=UTC)
    assert date.fromisoformat(field["snap-field"]["schedule_value"][:10]) == date(2031, 3, 1)
    ok(change(farm, "field", "pause_task", "snap-field"))
    assert snapshot(farm, "main")["snap-field"]["status"] == snapshot(farm, "field")["snap-field"]["status"] == "paused"
    ok(change(farm, "main", "cancel_task", "snap-field"))
    assert "snap-field" not in snapshot(farm, "main") and "snap-field" not in snapshot(farm, "field")


def test_a_group_has_a_limited_number_of_scheduled_tasks(tmp_path: Path) -> None:
    """Every task is a scheduler job and a line in main's snapshot: a group cannot create them without end."""
    data_dir = init_data_dir(tmp_path / "data")
    with running_daemon(data_dir, env=clean_env(FARMHOST_TASKS_PER_GROUP="3")):
        ids = [ok(schedule(data_dir, "field", "interval", 3_600_000))["taskId"] for _ in range(3)]
        sentence = failed(schedule(data_dir, "field", "interval", 3_600_000), "not_allowed")
        assert "already has 3 active or paused tasks" in sentence and "cancel one first" in sentence
        assert set(snapshot(data_dir, "field")) == set(ids)
        ok(change(data_dir, "field", "pause_task", ids[0]))  # paused tasks still count
        failed(schedule(data_dir, "field", "interval", 3_600_000), "not_allowed")
        ok(change(data_dir, "field", "cancel_task", ids[0]))
        ok(schedule(data_dir, "field", "interval", 3_600_000))
        ok(schedule(data_dir, "main", "interval", 3_600_000))  # the limit is per group
        failed(schedule(data_dir, "main", "interval", 3_600_000, groupFolder="field"), "not_allowed")
