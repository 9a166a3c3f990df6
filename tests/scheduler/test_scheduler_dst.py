"""DST: cron tasks walked by an injected clock across European spring-forward and fall-back nights.

Each due time fires once, no day is skipped, and a fixed hour does not fire twice in the repeated hour (the rules
of scheduler/specs.py, exercised through the service's claims).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from scheduler_support import Clock, insert, new_task, read_task, rows, scheduler, utc

STEP = timedelta(minutes=5)
HOUR = timedelta(hours=1)
WARSAW, LISBON, SANTIAGO = "Europe/Warsaw", "Europe/Lisbon", "America/Santiago"
# Warsaw 2030: 31 March 02:00 CET -> 03:00 CEST (02:30 does not exist); 27 October 03:00 CEST -> 02:00 CET (02:30
# happens twice). Lisbon 2030: 31 March 01:00 WET -> 02:00 WEST (01:30 does not exist). Santiago 2030: 8 September
# 00:00 -04 -> 01:00 -03 (that midnight does not exist).
SPRING = (utc(2030, 3, 29, 22, 0), utc(2030, 4, 1, 23, 0))
SANTIAGO_SPRING = (utc(2030, 9, 6, 22, 0), utc(2030, 9, 9, 23, 0))
AUTUMN = (utc(2030, 10, 25, 22, 0), utc(2030, 10, 28, 23, 0))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def _walk(data_dir: Path, zone: str, window: tuple[datetime, datetime], crons: dict[str, str]) -> Clock:
    """Create the cron tasks at the window's start, then move the clock through it in 5-minute steps."""
    start, end = window
    clock = Clock(start)
    insert(data_dir, *(new_task(task_id, "cron", value, now=start, tz=zone) for task_id, value in crons.items()))
    async with scheduler(data_dir, clock=clock, tz=zone) as h:
        while clock.now() < end:
            clock.set(clock.now() + STEP)
            await h.service.run_due()
        fired = {task_id: h.dispatch.due_times(task_id) for task_id in crons}
    for task_id, due in fired.items():  # every due time dispatched once, each one on time, each one a row
        assert [(r.due_at, r.status, r.claimed_at) for r in rows(data_dir, task_id)] == [(d, "ok", d) for d in due]
    return clock


def _hours(start: datetime, end: datetime) -> list[datetime]:
    first = start.replace(minute=0) + HOUR
    return [first + k * HOUR for k in range(int((end - first) / HOUR) + 1)]


@pytest.mark.parametrize(
    ("zone", "window", "daily", "expected_daily"),
    [
        pytest.param(
            WARSAW,
            SPRING,
            "30 2 * * *",
            # 02:30 CET, then the missing 02:30 runs once at 03:30 CEST, then 02:30 CEST.
            [utc(2030, 3, 30, 1, 30), utc(2030, 3, 31, 1, 30), utc(2030, 4, 1, 0, 30)],
            id="warsaw-spring-forward",
        ),
        pytest.param(
            WARSAW,
            AUTUMN,
            "30 2 * * *",
            # 02:30 CEST, then only the first of the two 02:30s (CEST), then 02:30 CET.
            [utc(2030, 10, 26, 0, 30), utc(2030, 10, 27, 0, 30), utc(2030, 10, 28, 1, 30)],
            id="warsaw-fall-back",
        ),
        pytest.param(
            LISBON,
            SPRING,
            "30 1 * * *",
            # 01:30 WET, then the missing 01:30 runs once at 02:30 WEST, then 01:30 WEST.
            [utc(2030, 3, 30, 1, 30), utc(2030, 3, 31, 1, 30), utc(2030, 4, 1, 0, 30)],
            id="lisbon-spring-forward",
        ),
    ],
)
async def test_cron_across_a_dst_change_fires_every_day_once(
    data_dir: Path, zone: str, window: tuple[datetime, datetime], daily: str, expected_daily: list[datetime]
) -> None:
    clock = await _walk(data_dir, zone, window, {"daily": daily, "hourly": "0 * * * *"})
    assert [r.due_at for r in rows(data_dir, "daily")] == expected_daily
    # The hour field is a wildcard: every real hour fires once, so the hourly task runs every UTC hour, including
    # both 02:00s of the fall-back night and none of the spring-forward night's missing hour twice.
    hourly = [r.due_at for r in rows(data_dir, "hourly")]
    assert hourly == _hours(*window) and len(hourly) == 73
    next_daily = read_task(data_dir, "daily").next_run
    assert next_daily is not None and clock.now() < next_daily <= clock.now() + 24 * HOUR


async def test_a_midnight_that_does_not_exist_runs_at_one_once(data_dir: Path) -> None:
    await _walk(data_dir, SANTIAGO, SANTIAGO_SPRING, {"midnight": "0 0 * * *", "midnight_and_one": "0 0,1 * * *"})
    # 00:00 -04, then the missing midnight once at 01:00 -03, then 00:00 -03: no day without its run.
    assert [r.due_at for r in rows(data_dir, "midnight")] == [
        utc(2030, 9, 7, 4),
        utc(2030, 9, 8, 4),
        utc(2030, 9, 9, 3),
    ]
    # The shifted midnight and the real 01:00 are one instant: one run, not two.
    assert [r.due_at for r in rows(data_dir, "midnight_and_one")] == [
        utc(2030, 9, 7, 4),
        utc(2030, 9, 7, 5),
        utc(2030, 9, 8, 4),
        utc(2030, 9, 9, 3),
        utc(2030, 9, 9, 4),
    ]
