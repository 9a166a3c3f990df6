from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from farmhost.scheduler.specs import (
    ScheduleError,
    ScheduleSpec,
    ScheduleType,
    first_run,
    next_run_after,
    parse_schedule,
)

LISBON = ZoneInfo("Europe/Lisbon")
DAY_MS = 24 * 3600 * 1000


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def cron(expr: str) -> ScheduleSpec:
    return parse_schedule("cron", expr, tz=LISBON)


# --- cron -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "now", "expected"),
    [
        # weekday numbering is crontab's: 0 and 7 are Sunday (2026-01-01 is a Thursday)
        ("0 6 * * 0", "2026-01-01T00:00", "2026-01-04T06:00"),
        ("0 6 * * 7", "2026-01-01T00:00", "2026-01-04T06:00"),
        ("0 6 * * sun", "2026-01-01T00:00", "2026-01-04T06:00"),
        ("0 6 * * 1", "2026-01-01T00:00", "2026-01-05T06:00"),
        ("0 6 * * 1-5", "2026-01-03T12:00", "2026-01-05T06:00"),
        ("0 6 * * 5-7", "2026-01-05T12:00", "2026-01-09T06:00"),
        ("0 6 * * */2", "2026-01-05T12:00", "2026-01-06T06:00"),  # sun,tue,thu,sat
        ("0 6 * * MON,wed", "2026-01-05T12:00", "2026-01-07T06:00"),
        # ranges and steps
        ("*/15 * * * *", "2026-01-01T10:07", "2026-01-01T10:15"),
        ("0 9-17/4 * * *", "2026-01-01T10:00", "2026-01-01T13:00"),
        ("0 0 1,15 * *", "2026-01-02T00:00", "2026-01-15T00:00"),
        ("0 0 1 1-12/3 *", "2026-01-02T00:00", "2026-03-31T23:00"),  # 00:00 WEST
        ("0 0 1 jun *", "2026-01-02T00:00", "2026-05-31T23:00"),
        # both day fields restricted: either matches (13th is a Tuesday, before Friday the 16th)
        ("0 0 13 * 5", "2026-01-10T00:00", "2026-01-13T00:00"),
        ("0 0 13 * 5", "2026-01-01T00:00", "2026-01-02T00:00"),
        # farm timezone: 06:00 Lisbon is 05:00 UTC in summer
        ("0 6 * * *", "2026-07-01T00:00", "2026-07-01T05:00"),
        # strictly after now
        ("0 6 * * *", "2026-01-01T06:00", "2026-01-02T06:00"),
        # spring forward 2026-03-29: 01:00 WET -> 02:00 WEST, 01:30 does not exist and fires at 02:30 WEST once
        ("30 1 * * *", "2026-03-28T12:00", "2026-03-29T01:30"),
        ("30 1 * * *", "2026-03-29T01:10", "2026-03-29T01:30"),
        ("30 1 * * *", "2026-03-29T01:30", "2026-03-30T00:30"),
        ("0 2 * * *", "2026-03-28T12:00", "2026-03-29T01:00"),
        # fall back 2026-10-25: 02:00 WEST -> 01:00 WET, 01:30 happens twice and a fixed hour fires the first only
        ("30 1 * * *", "2026-10-24T12:00", "2026-10-25T00:30"),
        ("30 1 * * *", "2026-10-25T00:30", "2026-10-26T01:30"),
        ("30 1 * * *", "2026-10-25T01:00", "2026-10-26T01:30"),
        # ... while a wildcard hour keeps firing through the repeated hour
        ("30 * * * *", "2026-10-25T00:30", "2026-10-25T01:30"),
        ("*/20 * * * *", "2026-10-25T00:45", "2026-10-25T01:00"),
    ],
)
def test_cron_next_run(expr: str, now: str, expected: str) -> None:
    spec = cron(expr)
    result = next_run_after(spec, tz=LISBON, anchor=utc("2020-01-01T00:00"), now=utc(now))
    assert result == utc(expected)
    assert result is not None and result.tzinfo is UTC
    assert first_run(spec, tz=LISBON, now=utc(now)) == result


def test_cron_sunday_is_sunday_in_farm_time() -> None:
    result = first_run(cron("0 6 * * 0"), tz=LISBON, now=utc("2026-06-01T00:00"))
    assert result.astimezone(LISBON).strftime("%A %H:%M") == "Sunday 06:00"


@pytest.mark.parametrize(("start", "end"), [("2026-03-25", "2026-04-02"), ("2026-10-21", "2026-10-29")])
def test_daily_cron_fires_once_per_local_day_across_dst(start: str, end: str) -> None:
    spec = cron("30 1 * * *")
    fires: list[datetime] = []
    now = utc(f"{start}T12:00")
    while (nxt := next_run_after(spec, tz=LISBON, anchor=now, now=now)) is not None and nxt < utc(f"{end}T00:00"):
        assert nxt > now
        fires.append(nxt)
        now = nxt
    local_days = [f.astimezone(LISBON).date() for f in fires]
    assert local_days == [local_days[0] + timedelta(days=i) for i in range(len(local_days))]
    # recomputing from any moment (e.g. after a restart) agrees with the chain
    probe = utc(f"{start}T12:00")
    while probe < fires[-1]:
        assert next_run_after(spec, tz=LISBON, anchor=probe, now=probe) == min(f for f in fires if f > probe)
        probe += timedelta(minutes=10)


def test_cron_whitespace_is_normalised() -> None:
    assert parse_schedule("cron", "  0   6 * *\t1 ", tz=LISBON) == ScheduleSpec(
        type=ScheduleType.CRON, value="0 6 * * 1"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("* * * *", "cron expression must have 5 fields (minute hour day month weekday), got 4"),
        ("0 0 * * * *", "cron expression must have 5 fields (minute hour day month weekday), got 6"),
        ("@daily", "got 1; shortcuts like @daily are not supported, write e.g. '0 0 * * *'"),
        ("", "must have 5 fields (minute hour day month weekday), got 0"),
        ("   ", "got 0"),
        (5, "cron expression must be a string of 5 fields (minute hour day month weekday), got 5"),
        ("61 * * * *", "invalid cron expression '61 * * * *': Error validating expression '61': the last value (61)"),
        ("0 24 * * *", "the last value (24) is higher than the maximum value (23)"),
        ("a * * * *", 'invalid cron expression \'a * * * *\': Unrecognized expression "a" for field "minute"'),
        ("*/0 * * * *", "invalid cron expression '*/0 * * * *': Increment must be higher than 0"),
        ("0 6 * * funday", "day-of-week 'funday' is not valid (use 0-7 or sun-sat, ranges a-b, steps /n)"),
        ("0 6 * * 8", "day-of-week '8' is not valid"),
        ("0 6 * * 5-1", "day-of-week '5-1' is not valid"),
        ("0 6 * * */0", "day-of-week '*/0' is not valid"),
        ("0 6 * * 1,,2", "day-of-week '' is not valid"),
        ("0 0 1 jan-mar/2 *", "month 'jan-mar/2': steps need month numbers, e.g. 1-12/3"),
        ("0 0 31 2 *", "cron expression '0 0 31 2 *' never fires: day 31 does not occur in month 2"),
        ("0 0 30,31 2 *", "never fires: day 30,31 does not occur in month 2"),
    ],
)
def test_cron_invalid(value: Any, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule("cron", value, tz=LISBON)


# --- interval -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "normalised"),
    [
        (3_600_000, "3600000"),
        ("3600000", "3600000"),
        (" 60000 ", "60000"),
        ("0060000", "60000"),
        (1000, "1000"),
        (1, "1"),
        ("500", "500"),
        (366 * DAY_MS, str(366 * DAY_MS)),
    ],
)
def test_interval_valid(value: str | int, normalised: str) -> None:
    spec = parse_schedule("interval", value, tz=LISBON)
    assert spec == ScheduleSpec(type=ScheduleType.INTERVAL, value=normalised)
    now = utc("2026-01-01T00:00")
    assert first_run(spec, tz=LISBON, now=now) == now + timedelta(milliseconds=int(normalised))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "interval must be a whole number of milliseconds > 0, got 0"),
        (-5000, "milliseconds > 0"),
        (366 * DAY_MS + 1, "interval must be at most 31622400000 ms (366 days), got 31622400001"),
        (1.5, "interval must be a whole number of milliseconds such as '3600000', got 1.5"),
        (3600000.0, "whole number of milliseconds"),
        (True, "whole number of milliseconds"),
        ("abc", "whole number of milliseconds"),
        ("-1000", "whole number of milliseconds"),
        ("1e6", "whole number of milliseconds"),
        ("1_000", "whole number of milliseconds"),
        ("١٠٠٠", "whole number of milliseconds"),
        ("", "whole number of milliseconds"),
    ],
)
def test_interval_invalid(value: Any, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule("interval", value, tz=LISBON)


@pytest.mark.parametrize(
    ("interval", "anchor", "now", "expected"),
    [
        (3_600_000, "2026-01-01T00:00", "2026-01-01T00:00", "2026-01-01T01:00"),
        (3_600_000, "2026-01-01T00:00", "2026-01-01T00:59:59.999", "2026-01-01T01:00"),
        (3_600_000, "2026-01-01T00:00", "2026-01-01T01:00", "2026-01-01T02:00"),
        (3_600_000, "2026-01-01T00:00", "2027-06-15T12:34:56.789", "2027-06-15T13:00"),
        (3_600_000, "2026-01-01T05:00", "2026-01-01T00:00", "2026-01-01T06:00"),  # anchor ahead of now: k = 1
        (7_000, "2026-01-01T00:00:00.250", "2026-01-12T13:46:40.253", "2026-01-12T13:46:46.250"),  # 1e6 s + 3 ms
        (DAY_MS, "2026-03-28T12:00", "2026-03-29T13:00", "2026-03-30T12:00"),  # elapsed time, DST ignored
    ],
)
def test_interval_is_anchored(interval: int, anchor: str, now: str, expected: str) -> None:
    spec = parse_schedule("interval", interval, tz=LISBON)
    result = next_run_after(spec, tz=LISBON, anchor=utc(anchor), now=utc(now))
    assert result == utc(expected)
    assert result is not None and result.tzinfo is UTC
    step = timedelta(milliseconds=interval)
    assert (result - utc(anchor)) % step == timedelta(0)
    assert utc(now) < result
    assert result - step <= max(utc(now), utc(anchor))


# --- once -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "normalised", "expected"),
    [
        ("2026-05-01T09:00", "2026-05-01T09:00:00+01:00", "2026-05-01T08:00"),  # naive: farm time (WEST)
        ("2026-01-15T09:00", "2026-01-15T09:00:00+00:00", "2026-01-15T09:00"),  # naive: farm time (WET)
        ("2026-05-01 09:00:30", "2026-05-01T09:00:30+01:00", "2026-05-01T08:00:30"),
        ("2026-05-01T09:00Z", "2026-05-01T09:00:00+00:00", "2026-05-01T09:00"),
        ("2026-05-01T09:00+02:00", "2026-05-01T09:00:00+02:00", "2026-05-01T07:00"),
        # fold=0: a non-existent time keeps the pre-gap offset (02:30 WEST), an ambiguous one is the first occurrence
        ("2026-03-29T01:30", "2026-03-29T01:30:00+00:00", "2026-03-29T01:30"),
        ("2026-10-25T01:30", "2026-10-25T01:30:00+01:00", "2026-10-25T00:30"),
    ],
)
def test_once_valid(value: str, normalised: str, expected: str) -> None:
    spec = parse_schedule("once", value, tz=LISBON)
    assert spec == ScheduleSpec(type=ScheduleType.ONCE, value=normalised)
    result = first_run(spec, tz=LISBON, now=utc("2026-01-01T00:00"))
    assert result == utc(expected)
    assert result.tzinfo is UTC
    assert next_run_after(spec, tz=LISBON, anchor=result, now=result) is None


def test_once_naive_uses_given_tz() -> None:
    new_york = parse_schedule("once", "2026-05-01T09:00", tz=ZoneInfo("America/New_York"))
    assert first_run(new_york, tz=ZoneInfo("America/New_York"), now=utc("2026-01-01T00:00")) == utc("2026-05-01T13:00")


@pytest.mark.parametrize("now", ["2026-05-01T08:00", "2026-05-01T08:00:01", "2027-01-01T00:00"])
def test_once_in_the_past(now: str) -> None:
    spec = parse_schedule("once", "2026-05-01T09:00", tz=LISBON)
    with pytest.raises(ScheduleError, match=re.escape("once time 2026-05-01T09:00:00+01:00 is in the past (now is ")):
        first_run(spec, tz=LISBON, now=utc(now))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tomorrow 9am", "once time 'tomorrow 9am' is not an ISO-8601 date-time such as '2026-05-01T09:00'"),
        ("2026-13-01T09:00", "is not an ISO-8601 date-time"),
        ("", "is not an ISO-8601 date-time"),
        ("2026-05-01", "once time '2026-05-01' has no time of day"),
        (1746090000, "once time must be an ISO-8601 date-time string"),
        ("0001-01-01T00:00:00+14:00", "is outside the supported date range (years 1-9999 in UTC)"),
        ("9999-12-31T23:59:59-14:00", "is outside the supported date range (years 1-9999 in UTC)"),
    ],
)
def test_once_invalid(value: Any, message: str) -> None:
    with pytest.raises(ScheduleError, match=re.escape(message)):
        parse_schedule("once", value, tz=LISBON)


def test_once_too_far_ahead_is_refused() -> None:
    spec = parse_schedule("once", "9999-12-31T23:59:59", tz=LISBON)
    with pytest.raises(ScheduleError, match="the first run is too far in the future"):
        first_run(spec, tz=LISBON, now=utc("2026-05-01T08:00"))


# --- general --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule_type", ["daily", "CRON", ""])
def test_unknown_schedule_type(schedule_type: str) -> None:
    with pytest.raises(ScheduleError, match="schedule_type must be one of cron, interval, once, when; got"):
        parse_schedule(schedule_type, "0 6 * * *", tz=LISBON)


def test_schedule_error_is_value_error() -> None:
    assert issubclass(ScheduleError, ValueError)


@pytest.mark.parametrize("spec", [cron("0 6 * * *"), ScheduleSpec(type=ScheduleType.INTERVAL, value="60000")])
def test_naive_datetimes_are_programming_errors(spec: ScheduleSpec) -> None:
    naive, aware = datetime(2026, 1, 1), utc("2026-01-01T00:00")
    with pytest.raises(ValueError, match="now must be a timezone-aware datetime") as info:
        first_run(spec, tz=LISBON, now=naive)
    assert not isinstance(info.value, ScheduleError)
    with pytest.raises(ValueError, match="anchor must be a timezone-aware datetime"):
        next_run_after(spec, tz=LISBON, anchor=naive, now=aware)
    with pytest.raises(ValueError, match="now must be a timezone-aware datetime"):
        next_run_after(spec, tz=LISBON, anchor=aware, now=naive)
