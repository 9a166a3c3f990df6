"""Schedule specs: validate cron/interval/once/when schedules and compute their run times (pure: time is passed in).

Cron follows crontab semantics in the farm timezone, DST changes included (`cron.py` says how). Naive ``once``
times are read in the farm timezone with ``fold=0``.

Every computation here is bounded, because an agent chooses the schedule: a cron whose day/month combination
can never exist (Feb 30, Apr 31) is refused by looking at its fields, not by searching for a fire time, and every
search stops at ``SEARCH_HORIZON``; a schedule whose first run lies beyond it is refused as too far in the future.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from enum import StrEnum
from typing import Final

from farmhost.scheduler.cron import CronError, next_fire, parse_cron
from farmhost.scheduler.when import ConditionError, parse_condition

_MIN_INTERVAL_MS = 1  # the contract: any whole number of milliseconds > 0
_MAX_INTERVAL_MS = 366 * 24 * 3600 * 1000
# Ten years: Feb 29 recurs at most 8 years apart (2096 -> 2104), so every cron that can fire fires within it; the
# search walks month by month, so even a cron that never matches costs about 120 steps, not 96,000 (to year 9999).
SEARCH_HORIZON: Final = timedelta(days=3653)


class ScheduleType(StrEnum):
    """How a task's schedule_value is read."""

    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"
    WHEN = "when"  # a farm event (scheduler/when.py): no due time until the condition becomes true


class ScheduleError(ValueError):
    """Raised with a human sentence an agent can act on.

    For example: "cron expression must have 5 fields (minute hour day month weekday), got 6".
    """


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """A validated schedule; ``value`` is normalised (cron whitespace, interval ms digits, once ISO with offset)."""

    type: ScheduleType
    value: str


def parse_schedule(schedule_type: str, schedule_value: object, *, tz: tzinfo) -> ScheduleSpec:
    """Validate a schedule as given to ``schedule_task`` and normalise its value.

    Args:
        schedule_type: ``cron``, ``interval``, ``once`` or ``when``.
        schedule_value: 5-field crontab, interval in milliseconds, ISO-8601 date-time, or a when condition (a JSON
            object, stored as canonical JSON).
        tz: The farm's timezone (cron evaluation, naive once times).

    Returns:
        The normalised spec.

    Raises:
        ScheduleError: If the type or value is invalid.
    """
    if schedule_type == ScheduleType.WHEN:
        try:
            return ScheduleSpec(type=ScheduleType.WHEN, value=parse_condition(schedule_value).canonical())
        except ConditionError as err:
            raise ScheduleError(str(err)) from None
    if isinstance(schedule_value, Mapping):
        raise ScheduleError(f"schedule_value of a {schedule_type} task must be a string or a number, not an object")
    if schedule_type == ScheduleType.CRON:
        try:
            return ScheduleSpec(type=ScheduleType.CRON, value=parse_cron(schedule_value))
        except CronError as err:
            raise ScheduleError(str(err)) from None
    if schedule_type == ScheduleType.INTERVAL:
        return ScheduleSpec(type=ScheduleType.INTERVAL, value=str(_parse_interval(schedule_value)))
    if schedule_type == ScheduleType.ONCE:
        return ScheduleSpec(type=ScheduleType.ONCE, value=_parse_once(schedule_value, tz).isoformat())
    raise ScheduleError(f"schedule_type must be one of cron, interval, once, when; got {schedule_type!r}")


def first_run(spec: ScheduleSpec, *, tz: tzinfo, now: datetime) -> datetime | None:
    """Return when a newly created task first runs (aware, UTC); None for a when task (it waits for its event).

    Raises:
        ScheduleError: If a once time is not strictly after ``now`` or a cron never fires again.
        ValueError: If ``now`` is naive.
    """
    now_utc = _aware_utc(now, "now")
    if spec.type == ScheduleType.WHEN:
        return None
    if spec.type == ScheduleType.INTERVAL:
        return now_utc + timedelta(milliseconds=_parse_interval(spec.value))
    if spec.type == ScheduleType.ONCE:
        at = _once_utc(_parse_once(spec.value, tz), spec.value)
        if at <= now_utc:
            raise ScheduleError(f"once time {spec.value} is in the past (now is {now_utc.isoformat()})")
        if at > now_utc + SEARCH_HORIZON:
            raise ScheduleError(f"once time {spec.value}: the first run is too far in the future ({_horizon_text()})")
        return at
    fire = next_fire(spec.value, tz, after=now_utc, until=now_utc + SEARCH_HORIZON)
    if fire is None:
        raise ScheduleError(
            f"cron expression {spec.value!r}: the first run is too far in the future ({_horizon_text()})"
        )
    return fire


def next_run_after(spec: ScheduleSpec, *, tz: tzinfo, anchor: datetime, now: datetime) -> datetime | None:
    """Return the next due time strictly after ``now`` (aware, UTC), or None if there is none.

    Cron: the next fire time after ``now`` (None beyond ``SEARCH_HORIZON``). Interval: ``anchor + k * interval`` for the smallest ``k >= 1``
    that is after ``now`` (no drift). Once: None, a once task has no next run. When: None, its due times come
    from its events (scheduler/watcher.py).

    Raises:
        ValueError: If ``anchor`` or ``now`` is naive.
    """
    anchor_utc, now_utc = _aware_utc(anchor, "anchor"), _aware_utc(now, "now")
    if spec.type in (ScheduleType.ONCE, ScheduleType.WHEN):
        return None
    if spec.type == ScheduleType.INTERVAL:
        step = timedelta(milliseconds=_parse_interval(spec.value))
        elapsed = now_utc - anchor_utc
        k = elapsed // step + 1 if elapsed >= timedelta(0) else 1
        return anchor_utc + k * step
    return next_fire(spec.value, tz, after=now_utc, until=now_utc + SEARCH_HORIZON)


def _aware_utc(value: datetime, name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got naive {value!r}")
    return value.astimezone(UTC)


def _horizon_text() -> str:
    return f"more than {SEARCH_HORIZON.days // 365} years ahead; schedule it closer"


def _once_utc(at: datetime, value: str) -> datetime:
    try:
        return at.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 with an offset: the instant falls outside what datetime holds
        raise ScheduleError(
            f"once time {value!r} is outside the supported date range (years 1-9999 in UTC); give a date-time "
            "such as '2026-05-01T09:00'"
        ) from None


def _parse_interval(value: object) -> int:
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        ms = int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ScheduleError(f"interval must be a whole number of milliseconds such as '3600000', got {value!r}")
    if ms < _MIN_INTERVAL_MS:
        raise ScheduleError(f"interval must be a whole number of milliseconds > 0, got {ms}")
    if ms > _MAX_INTERVAL_MS:
        raise ScheduleError(f"interval must be at most {_MAX_INTERVAL_MS} ms (366 days), got {ms}")
    return ms


def _parse_once(value: object, tz: tzinfo) -> datetime:
    example = "such as '2026-05-01T09:00' (farm time) or '2026-05-01T08:00Z'"
    if not isinstance(value, str):
        raise ScheduleError(f"once time must be an ISO-8601 date-time string {example}, got {value!r}")
    try:
        date.fromisoformat(value)
    except ValueError:
        pass
    else:
        raise ScheduleError(f"once time {value!r} has no time of day; give a date-time {example}")
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise ScheduleError(f"once time {value!r} is not an ISO-8601 date-time {example}") from None
    at = at.replace(tzinfo=tz, fold=0) if at.tzinfo is None else at
    _once_utc(at, value)
    return at
