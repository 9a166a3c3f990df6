"""Cron: validate a 5-field crontab and find its next fire time in the farm's zone, across DST changes (pure).

Crontab semantics: weekday 0 and 7 are Sunday, and when both day-of-month and day-of-week are restricted a day
matches if either does. APScheduler's CronTrigger decides which wall-clock times match, run in UTC, a zone without
DST, so that it walks the local calendar minute by minute with nothing skipped or repeated; this module then turns
each matching wall time into the instants it fires at:

- a wall time that exists once fires then;
- a wall time that does not exist (in a spring-forward gap) fires once, shifted by the gap: read with the offset
  before the change, an hour later on the wall clock for a one-hour gap. So ``30 2 * * *`` fires at 03:30 on the
  night 02:00 becomes 03:00, ``* 2 * * *`` fires each minute 03:00-03:59, and ``0 * * * *`` fires once at 03:00
  (the shifted 02:00 and the real 03:00 are one instant, one run);
- a wall time that occurs twice (fall back) fires at its first occurrence, and at its second too when the hour
  field is a wildcard (``*``, ``*/2``): an hourly task runs every real hour, a daily one once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Final

from apscheduler.triggers.cron import CronTrigger

# Longer than any daylight-saving change (2 h at Antarctica/Troll): a wall time and the instant it fires at are
# never further apart than the zone's offsets, so a search that looks this far either side misses nothing.
_SHIFT_BOUND: Final = timedelta(hours=3)
_TICK: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_LEAP_YEAR: Final = 2000  # month/day combinations are checked on a leap year, so Feb 29 counts as existing
_DOW_NAMES: Final = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # index == crontab weekday number


class CronError(ValueError):
    """A cron expression that is not valid, with a sentence an agent can act on."""


def parse_cron(value: object) -> str:
    """Validate a crontab expression and return it normalised (fields separated by one space).

    Raises:
        CronError: If it is not 5 valid fields, or its day/month fields can never occur (Feb 30).
    """
    if not isinstance(value, str):
        raise CronError(f"cron expression must be a string of 5 fields (minute hour day month weekday), got {value!r}")
    fields = value.split()
    if len(fields) != 5:
        hint = "; shortcuts like @daily are not supported, write e.g. '0 0 * * *'" if value.startswith("@") else ""
        raise CronError(f"cron expression must have 5 fields (minute hour day month weekday), got {len(fields)}{hint}")
    normalised = " ".join(fields)
    try:
        triggers = _wall_triggers(normalised, end=_EPOCH)
    except ValueError as exc:
        raise CronError(f"invalid cron expression {normalised!r}: {exc}") from None
    if not any(_day_exists(trigger) for trigger in triggers):
        raise CronError(
            f"cron expression {normalised!r} never fires: day {fields[2]} does not occur in month {fields[3]}; "
            "pick days that exist in those months (e.g. 1-28, or 'last')"
        )
    return normalised


def next_fire(expr: str, tz: tzinfo, *, after: datetime, until: datetime) -> datetime | None:
    """Return the first fire time of a valid cron strictly after ``after`` (aware, UTC), None if not by ``until``.

    Args:
        expr: A normalised expression (`parse_cron`).
        tz: The farm's timezone.
        after: Aware, UTC.
        until: Aware, UTC; the search stops there, so a cron that rarely matches costs a bounded walk.
    """
    triggers = _wall_triggers(expr, end=_wall(until, tz) + _SHIFT_BOUND)
    wall = _next_match(triggers, _wall(after, tz))
    if wall is None:
        return None
    first = _instant(wall, tz, fold=0)
    shift = _shift_near(tz, after, first)
    # Near a DST change wall order and instant order may differ: look around it.
    fire = _earliest_near_a_change(triggers, expr, tz, after=after, shift=shift) if shift else first
    return fire if fire is not None and fire <= until else None


def _earliest_near_a_change(
    triggers: list[Any], expr: str, tz: tzinfo, *, after: datetime, shift: timedelta
) -> datetime | None:
    """Walk the matching wall times from ``shift`` before ``after`` and keep the earliest instant after it.

    A time shifted out of a gap fires after real wall times that follow it, and a repeated time's second occurrence
    after first occurrences that follow it, by at most the change's size; so the walk starts that far before
    ``after`` and stops that far past the best instant found.
    """
    folds = (0, 1) if expr.split()[1].startswith("*") else (0,)
    best: datetime | None = None
    cursor = _wall(after, tz) - shift - _TICK
    while (wall := _next_match(triggers, cursor)) is not None:
        if best is not None and wall > _wall(best, tz) + shift:
            break
        for fold in folds:
            instant = _instant(wall, tz, fold=fold)
            if instant > after and (best is None or instant < best):
                best = instant
        cursor = wall
    return best


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    """The farm's wall-clock time at ``instant``, labelled UTC (the clock the triggers run on)."""
    return instant.astimezone(tz).replace(tzinfo=UTC, fold=0)


def _instant(wall: datetime, tz: tzinfo, *, fold: int) -> datetime:
    """When a wall time fires: fold 0 is the first occurrence, or for a time in a gap the offset before it."""
    local = wall.replace(tzinfo=tz, fold=fold)
    if fold == 1 and local.astimezone(UTC) <= wall.replace(tzinfo=tz, fold=0).astimezone(UTC):
        return _instant(wall, tz, fold=0)  # not a repeated time (in a gap fold 1 would move it back)
    return local.astimezone(UTC)


def _shift_near(tz: tzinfo, *instants: datetime) -> timedelta:
    """How far the zone's offset moves within `_SHIFT_BOUND` of the instants: zero when it keeps one offset."""
    offsets = [
        offset
        for instant in instants
        for delta in (-_SHIFT_BOUND, timedelta(0), _SHIFT_BOUND)
        if (offset := (instant + delta).astimezone(tz).utcoffset()) is not None
    ]
    return max(offsets) - min(offsets)


def _next_match(triggers: list[Any], wall: datetime) -> datetime | None:
    """The first wall time strictly after ``wall`` that the expression matches."""
    fires = [fire for trigger in triggers if (fire := trigger.get_next_fire_time(None, wall + _TICK)) is not None]
    return min(fires, default=None)


def _wall_triggers(expr: str, *, end: datetime) -> list[Any]:
    """CronTriggers on the wall clock (UTC) matching ``expr``: one, or two when both day fields are restricted."""
    minute, hour, dom, month, dow = expr.split()
    weekdays = _crontab_weekdays(dow)
    if "/" in month and any(char.isalpha() for char in month):  # APScheduler silently drops these steps
        raise ValueError(f"month {month!r}: steps need month numbers, e.g. 1-12/3")
    days = [(dom, weekdays)] if dom.startswith("*") or dow.startswith("*") else [(dom, "*"), ("*", weekdays)]
    return [
        CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=dow_f, timezone=UTC, end_date=end)
        for day, dow_f in days
    ]


def _day_exists(trigger: Any) -> bool:
    """Whether some month the trigger allows has a day it allows (hours, minutes and weekdays always occur)."""
    month_field, day_field = trigger.fields[1], trigger.fields[2]
    for month in range(1, 13):
        first = datetime(_LEAP_YEAR, month, 1)
        if month_field.get_next_value(first) == month and day_field.get_next_value(first) is not None:
            return True
    return False


def _crontab_weekdays(field: str) -> str:
    """Translate a crontab day-of-week field (0/7 = Sunday) into APScheduler weekday names."""
    days: set[int] = set()
    for item in field.lower().split(","):
        base, slash, step_text = item.partition("/")
        lo_text, dash, hi_text = base.partition("-")
        step = int(step_text) if step_text.isascii() and step_text.isdigit() else 0 if slash else 1
        if base == "*":
            lo, hi = 0, 7
        else:
            lo = _weekday_number(lo_text, item)
            hi = _weekday_number(hi_text, item) if dash else 7 if slash else lo
        if step < 1 or lo > hi:
            raise ValueError(f"day-of-week {item!r} is not valid (use 0-7 or sun-sat, ranges a-b, steps /n)")
        days.update(day % 7 for day in range(lo, hi + 1, step))
    return "*" if len(days) == 7 else ",".join(_DOW_NAMES[day] for day in sorted(days))


def _weekday_number(text: str, item: str) -> int:
    if text in _DOW_NAMES:
        return _DOW_NAMES.index(text)
    if text.isascii() and text.isdigit() and int(text) <= 7:
        return int(text)
    raise ValueError(f"day-of-week {item!r} is not valid (use 0-7 or sun-sat, ranges a-b, steps /n)")
