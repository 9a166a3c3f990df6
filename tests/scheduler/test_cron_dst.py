"""Cron fire times across daylight-saving changes, in every kind of zone, against a brute-force reference.

The rule (docs/scheduler.md): a matching wall time that does not exist (spring forward) fires once, shifted by the
gap (an hour later on the wall clock for a one-hour gap; half an hour at Lord Howe); a matching wall time that
occurs twice fires once, at its first occurrence, unless the hour field is a wildcard (then at both). A shifted
time that lands on another fire time is one run. None lost, none twice, and the same answer from any `now`.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest

from farmhost.scheduler.specs import first_run, next_run_after, parse_schedule

MINUTE = timedelta(minutes=1)
WINDOW = timedelta(hours=5)  # each side of a change: longer than any shift (2 h), and reaches its day's midnight
ANCHOR = datetime(2020, 1, 1, tzinfo=UTC)
ZONES = [
    "Europe/Berlin",  # 02:00 -> 03:00, 03:00 -> 02:00
    "America/New_York",
    "America/Santiago",  # 24:00 -> 01:00: midnight does not exist
    "America/Havana",  # midnight too, and the repeated hour is 00:00-01:00
    "Asia/Beirut",  # midnight
    "Australia/Lord_Howe",  # a 30-minute change
    "Antarctica/Troll",  # a 2-hour change
]
YEARS = [2026, 2028]
EXPRS = [
    "30 2 * * *",
    "0 2 * * *",
    "0,30 2 * * *",
    "* 2 * * *",
    "59 1 * * *",
    "0 0 * * *",
    "30 0 * * *",
    "0 0,1 * * *",
    "0 1 * * *",
    "30 1-3 * * *",
    "45 23 * * *",
    "0 * * * *",
    "15,45 * * * *",
    "*/30 * * * *",
    "10 */2 * * *",
    "0 0 * 3,9,10 0",  # Sunday midnights in the months of the changes
]


@functools.cache
def _values(field: str, lo: int, hi: int) -> frozenset[int]:
    values: set[int] = set()
    for part in field.split(","):
        base, slash, step = part.partition("/")
        first, dash, last = base.partition("-")
        a, b = (lo, hi) if base == "*" else (int(first), int(last) if dash else hi if slash else int(first))
        values.update(range(a, b + 1, int(step) if slash else 1))
    return frozenset(values)


def _matches(expr: str, wall: datetime) -> bool:
    """Crontab matching of a wall time, written out independently of the product (numbers, ranges, steps)."""
    minute, hour, dom, month, dow = expr.split()
    weekdays = {day % 7 for day in _values(dow, 0, 7)}
    in_dom, in_dow = wall.day in _values(dom, 1, 31), (wall.weekday() + 1) % 7 in weekdays
    day = in_dom and in_dow if dom.startswith("*") or dow.startswith("*") else in_dom or in_dow
    return (
        wall.minute in _values(minute, 0, 59)
        and wall.hour in _values(hour, 0, 23)
        and day
        and (wall.month in _values(month, 1, 12))
    )


def _changes(tz: tzinfo, year: int) -> list[datetime]:
    """The instants the zone's offset changes in `year` (to the minute)."""
    found, at = [], datetime(year, 1, 1, tzinfo=UTC)
    offset = at.astimezone(tz).utcoffset()
    while at.year == year:
        at += timedelta(minutes=30)
        if (now := at.astimezone(tz).utcoffset()) != offset:
            step_back = at - timedelta(minutes=30)
            while step_back.astimezone(tz).utcoffset() == offset:
                step_back += MINUTE
            found.append(step_back)
            offset = now
    return found


def _reference(expr: str, tz: tzinfo, lo: datetime, hi: datetime) -> set[datetime]:
    """Every fire time in [lo, hi) by the rule, minute by minute: real instants, then the wall times in gaps."""
    both = expr.split()[1].startswith("*")
    fires, at = set(), lo
    while at < hi:
        local = at.astimezone(tz)
        repeated = local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()
        if _matches(expr, local.replace(tzinfo=None)) and (both or not repeated):
            fires.add(at)
        at += MINUTE
    wall, last = (lo - WINDOW).astimezone(tz).replace(tzinfo=None), (hi + WINDOW).astimezone(tz).replace(tzinfo=None)
    while wall < last:
        instant = wall.replace(tzinfo=tz).astimezone(UTC)  # fold=0: the offset before the change, i.e. shifted
        if instant.astimezone(tz).replace(tzinfo=None) != wall and _matches(expr, wall) and lo <= instant < hi:
            fires.add(instant)
        wall += MINUTE
    return fires


def _chain(expr: str, tz: tzinfo, lo: datetime, hi: datetime) -> list[datetime]:
    spec = parse_schedule("cron", expr, tz=tz)
    fires: list[datetime] = []
    at = first_run(spec, tz=tz, now=lo - timedelta(microseconds=1))
    while at is not None and at < hi:
        fires.append(at)
        at = next_run_after(spec, tz=tz, anchor=ANCHOR, now=at)
    return fires


@pytest.mark.parametrize("zone", ZONES)
def test_cron_matches_the_reference_around_every_change(zone: str) -> None:
    tz = ZoneInfo(zone)
    changes = [change for year in YEARS for change in _changes(tz, year)]
    assert changes, f"{zone} has no offset change in {YEARS}"
    for change in changes:
        lo, hi = change - WINDOW, change + WINDOW
        for expr in EXPRS:
            fires = _chain(expr, tz, lo, hi)
            assert fires == sorted(set(fires)), (zone, change, expr)  # strictly increasing: none twice
            assert set(fires) == _reference(expr, tz, lo, hi), (zone, change, expr)
            spec = parse_schedule("cron", expr, tz=tz)
            probe = lo
            while probe < hi - 2 * WINDOW / 3:  # a restart at any moment computes the same next fire time
                expected = min((f for f in fires if f > probe), default=None)
                got = next_run_after(spec, tz=tz, anchor=ANCHOR, now=probe)
                assert expected is None or got == expected, (zone, change, expr, probe)
                probe += timedelta(minutes=29)


def _local(zone: str, expr: str, start: str, count: int) -> list[str]:
    tz = ZoneInfo(zone)
    spec = parse_schedule("cron", expr, tz=tz)
    at = first_run(spec, tz=tz, now=datetime.fromisoformat(start).replace(tzinfo=tz))
    fires = []
    while at is not None and len(fires) < count:
        fires.append(at.astimezone(tz).isoformat(timespec="minutes"))
        at = next_run_after(spec, tz=tz, anchor=ANCHOR, now=at)
    return fires


@pytest.mark.parametrize(
    ("zone", "expr", "start", "expected"),
    [
        pytest.param(
            "America/Santiago",
            "0 0 * * *",
            "2026-09-04T12:00",
            ["2026-09-05T00:00-04:00", "2026-09-06T01:00-03:00", "2026-09-07T00:00-03:00"],
            id="santiago-midnight-that-does-not-exist",
        ),
        pytest.param(
            "Asia/Beirut",
            "0 0 * * *",
            "2026-03-27T12:00",
            ["2026-03-28T00:00+02:00", "2026-03-29T01:00+03:00", "2026-03-30T00:00+03:00"],
            id="beirut-midnight",
        ),
        pytest.param(
            "America/Havana",
            "0 0 * * *",
            "2026-03-06T12:00",
            ["2026-03-07T00:00-05:00", "2026-03-08T01:00-04:00", "2026-03-09T00:00-04:00"],
            id="havana-midnight",
        ),
        pytest.param(
            "America/Santiago",
            "0 0 * 9 0",
            "2027-08-30T00:00",
            ["2027-09-05T01:00-03:00", "2027-09-12T00:00-03:00"],
            id="santiago-sunday-midnight-in-september",
        ),
        pytest.param(
            "Europe/Berlin",
            "30 2 * * *",
            "2026-03-28T23:00",
            ["2026-03-29T03:30+02:00", "2026-03-30T02:30+02:00"],
            id="berlin-0230-an-hour-later",
        ),
        pytest.param(
            "Europe/Berlin",
            "0,30 2 * * *",
            "2026-03-28T23:00",
            ["2026-03-29T03:00+02:00", "2026-03-29T03:30+02:00", "2026-03-30T02:00+02:00"],
            id="berlin-0200-and-0230-both-shifted",
        ),
        pytest.param(
            "Europe/Berlin",
            "* 2 * * *",
            "2026-03-28T23:00",
            ["2026-03-29T03:00+02:00", "2026-03-29T03:01+02:00", "2026-03-29T03:02+02:00"],
            id="berlin-every-minute-of-the-missing-hour",
        ),
        pytest.param(
            "Europe/Berlin",
            "0 2,3 * * *",
            "2026-03-28T23:00",
            ["2026-03-29T03:00+02:00", "2026-03-30T02:00+02:00"],
            id="berlin-shifted-0200-and-0300-are-one-run",
        ),
        pytest.param(
            "Australia/Lord_Howe",
            "0 * * * *",
            "2026-10-04T01:30",
            ["2026-10-04T02:30+11:00", "2026-10-04T03:00+11:00"],
            id="lord-howe-half-hour-gap",
        ),
    ],
)
def test_cron_fire_times_in_a_gap(zone: str, expr: str, start: str, expected: list[str]) -> None:
    assert _local(zone, expr, start, len(expected)) == expected


def test_every_minute_of_a_missing_hour_fires_once_each() -> None:
    fires = _local("Europe/Berlin", "* 2 * * *", "2026-03-28T23:00", 61)
    assert fires[:60] == [f"2026-03-29T03:{m:02d}+02:00" for m in range(60)]
    assert fires[60] == "2026-03-30T02:00+02:00"
