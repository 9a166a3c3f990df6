"""ha_history: what entities did over a period, from Home Assistant's recorder, summarised (the morning report too).

The history comes over the WebSocket (`history/history_during_period`, minimal response, no attributes): one
command on the connection farmhost already keeps open, the entity ids as a list rather than a comma-joined URL
parameter, and HA's compressed rows (state and a float timestamp), a third of REST's size for the same period.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import InvalidRequest
from farmhost.farm.core_actions import require_ha

if TYPE_CHECKING:
    from collections.abc import Sequence
    from zoneinfo import ZoneInfo

    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext
    from farmhost.protocol.params import HaHistoryParams

# SPEC §5: "a period of at most 31 days"; HA's recorder keeps 10 days unless its purge_keep_days says more.
MAX_PERIOD: Final = timedelta(days=31)
_RANGE: Final = "years 1-9999 in UTC, a day after the first"
DEFAULT_PERIOD: Final = timedelta(hours=24)  # "how long did the pump run?" means the last day unless said
# Two a hour over a day: enough to see a night's curve, small enough for a model's context at 20 entities.
MAX_POINTS: Final = 48
ON_STATES: Final = frozenset({"on", "open"})
OFF_STATES: Final = frozenset({"off", "closed"})
NO_VALUE: Final = frozenset({"unavailable", "unknown", ""})
# Text entities (a select, the weather) report time per state; a long-lived one may have had many.
MAX_TEXT_STATES: Final = 12


@dataclass(frozen=True, kw_only=True)
class Change:
    """One recorded state of an entity and when it began."""

    at: datetime
    state: str


async def ha_history(deps: FarmDeps, ctx: RequestContext, p: HaHistoryParams) -> dict[str, Any]:
    """What the entities did over the period: `{entityIds, start?, end?}` (at most 31 days; default the last 24 h).

    Numbers come as min, max, time-weighted mean, last and at most 48 points; on/off entities as seconds on and
    how often they were turned on; other states as seconds per state. Times are the farm's time zone.

    Returns:
        `{start, end, entities: {id: summary}, missing}`: `missing` lists ids HA does not know (not an error).

    Raises:
        InvalidRequest: a time that is not ISO 8601, `start` not before `end`, or a period over 31 days.
    """
    zone = deps.settings.zone
    start, end = history_period(p.start, p.end, now=ctx.now, zone=zone)
    ha = require_ha(deps)
    known = {str(s.get("entity_id")) for s in await ha.get_states()}
    wanted = [e for e in dict.fromkeys(p.entityIds) if e in known]
    history = await fetch_history(ha, wanted, start, end) if wanted else {}
    # A month of a 30 s sensor is ~0.3 s of arithmetic: off the event loop, which serves every group meanwhile.
    entities = await asyncio.to_thread(lambda: {e: summarise(history.get(e, []), start, end, zone) for e in wanted})
    return {
        "start": _local(start, zone),
        "end": _local(end, zone),
        "entities": entities,
        "missing": sorted(set(p.entityIds) - known),
    }


def history_period(start: str | None, end: str | None, *, now: datetime, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The period asked for, as aware UTC times: `end` defaults to now, `start` to a day before `end`.

    An `end` after now is cut to now (nothing is recorded there yet).

    Raises:
        InvalidRequest: naming the field that is not an ISO 8601 time, is in the future, or makes the period
            empty or longer than 31 days.
    """
    end_at = min(_parse_time(end, "end", zone), now) if end is not None else now
    try:
        start_at = _parse_time(start, "start", zone) if start is not None else end_at - DEFAULT_PERIOD
    except OverflowError:  # the default start, a day before an `end` in year 1
        raise InvalidRequest(f"ha_history: param 'end' is outside the supported date range ({_RANGE})") from None
    if start_at >= now:
        raise InvalidRequest(
            f"ha_history: param 'start' is in the future ({_local(start_at, zone)}); nothing is recorded yet"
        )
    if start_at >= end_at:
        raise InvalidRequest(
            f"ha_history: param 'start' ({_local(start_at, zone)}) must be before 'end' ({_local(end_at, zone)})"
        )
    if end_at - start_at > MAX_PERIOD:
        days = (end_at - start_at) / timedelta(days=1)
        raise InvalidRequest(
            f"ha_history: the period from 'start' to 'end' is {days:.1f} days; at most {MAX_PERIOD.days} days are "
            "allowed (ask for several periods)"
        )
    return start_at, end_at


async def fetch_history(
    ha: HAClient, entity_ids: Sequence[str], start: datetime, end: datetime
) -> dict[str, list[Change]]:
    """Every recorded state of `entity_ids` in the period, each list beginning with the state held at `start`."""
    raw = await ha.ws_command(
        "history/history_during_period",
        start_time=start.isoformat(),
        end_time=end.isoformat(),
        entity_ids=list(entity_ids),
        include_start_time_state=True,
        significant_changes_only=False,
        minimal_response=True,
        no_attributes=True,
    )
    rows = raw if isinstance(raw, dict) else {}
    return {str(entity): _changes(entries) for entity, entries in rows.items() if isinstance(entries, list)}


def summarise(changes: Sequence[Change], start: datetime, end: datetime, zone: ZoneInfo) -> dict[str, Any]:
    """One entity's summary over [start, end]: a number, on/off, or text entity, told by the states it had.

    A state holds from its time until the next one (the state at `start` from `start`); `unavailable` and
    `unknown` count as no value: they are left out of the mean and the on-time, and reported as such.
    """
    spans = _spans(changes, start, end)
    if not spans:
        return {"kind": "none", "changes": 0}
    states = [s.state for s in changes if s.state not in NO_VALUE]
    no_value = sum(seconds for state, _, seconds in spans if state in NO_VALUE)
    base: dict[str, Any] = {"last": spans[-1][0], "changes": len(spans) - 1}
    if no_value:
        base["unavailableSeconds"] = round(no_value)
    if states and all(_number(s) is not None for s in states):
        return {"kind": "number", **base, **_numbers(spans, start, end, zone), "last": _number(spans[-1][0])}
    if states and all(s in ON_STATES | OFF_STATES for s in states):
        on = sum(seconds for state, _, seconds in spans if state in ON_STATES)
        valued = [state for state, _, _ in spans if state not in NO_VALUE]  # on, unavailable, on: never turned on
        turned_on = sum(1 for before, after in pairwise(valued) if after in ON_STATES and before in OFF_STATES)
        return {"kind": "on_off", **base, "onSeconds": round(on), "turnedOn": turned_on}
    per_state: dict[str, float] = {}
    for state, _, seconds in spans:
        per_state[state] = per_state.get(state, 0.0) + seconds
    top = sorted(per_state.items(), key=lambda kv: -kv[1])[:MAX_TEXT_STATES]
    return {"kind": "text", **base, "seconds": {state: round(seconds) for state, seconds in top}}


# helpers ---------------------------------------------------------------------------------------------


def _parse_time(text: str, field: str, zone: ZoneInfo) -> datetime:
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidRequest(
            f"ha_history: param {field!r} must be an ISO 8601 time such as 2026-12-04T06:00 or "
            f"2026-12-04T06:00:00+01:00 (got {text[:40]!r})"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=zone)  # a time without an offset is the farmer's clock
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 with an offset: the instant falls outside what datetime holds
        raise InvalidRequest(
            f"ha_history: param {field!r} is outside the supported date range ({_RANGE}; got {text[:40]!r})"
        ) from None


def _changes(entries: list[Any]) -> list[Change]:
    out: list[Change] = []
    for row in entries:
        if not isinstance(row, dict):
            continue
        stamp = row.get("lc", row.get("lu"))
        if not isinstance(stamp, int | float):
            continue
        out.append(Change(at=datetime.fromtimestamp(stamp, UTC), state=str(row.get("s", ""))))
    return out


def _spans(changes: Sequence[Change], start: datetime, end: datetime) -> list[tuple[str, datetime, float]]:
    """(state, from, seconds held within the period), in time order; a state recorded before `start` holds from it."""
    ordered = sorted((c for c in changes if c.at <= end), key=lambda c: c.at)
    spans: list[tuple[str, datetime, float]] = []
    for i, change in enumerate(ordered):
        begin = max(change.at, start)
        until = ordered[i + 1].at if i + 1 < len(ordered) else end
        if until <= start or (i + 1 < len(ordered) and until == change.at):
            continue  # replaced before the period began, or in the same instant (HA's start row and a change at it)
        if spans and spans[-1][0] == change.state:
            continue  # a repeat of the same state (an attribute-only row): the span already runs on
        spans.append((change.state, begin, 0.0))
    return [
        (state, begin, ((spans[i + 1][1] if i + 1 < len(spans) else end) - begin).total_seconds())
        for i, (state, begin, _) in enumerate(spans)
    ]


def _numbers(
    spans: list[tuple[str, datetime, float]], start: datetime, end: datetime, zone: ZoneInfo
) -> dict[str, Any]:
    valued = [(v, begin, seconds) for state, begin, seconds in spans if (v := _number(state)) is not None]
    values = [v for v, _, _ in valued]
    weight = sum(seconds for _, _, seconds in valued)
    mean = sum(v * seconds for v, _, seconds in valued) / weight if weight > 0 else values[-1]
    if len(valued) <= MAX_POINTS:
        points = [[_local(begin, zone), v] for v, begin, _ in valued]
    else:
        points = _downsampled(valued, start, end, zone)
    return {"min": min(values), "max": max(values), "mean": _round(mean), "points": points}


def _downsampled(
    valued: list[tuple[float, datetime, float]], start: datetime, end: datetime, zone: ZoneInfo
) -> list[list[Any]]:
    """MAX_POINTS equal slices of the period, each the time-weighted mean of the values within it.

    One pass: each value's span adds to the slices it overlaps (a month of a 30 s sensor is ~90,000 rows).
    """
    origin, step = start.timestamp(), (end - start).total_seconds() / MAX_POINTS
    totals, weights = [0.0] * MAX_POINTS, [0.0] * MAX_POINTS
    for value, begin, seconds in valued:
        lo = begin.timestamp() - origin
        hi = lo + seconds
        first, last = max(0, int(lo // step)), min(MAX_POINTS - 1, int(hi // step))
        for i in range(first, last + 1):
            overlap = min(hi, (i + 1) * step) - max(lo, i * step)
            if overlap > 0:
                totals[i] += value * overlap
                weights[i] += overlap
    return [
        [_local(start + timedelta(seconds=step * i), zone), _round(totals[i] / weights[i])]
        for i in range(MAX_POINTS)
        if weights[i] > 0
    ]


def _number(state: str) -> float | None:
    try:
        value = float(state)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _round(value: float) -> float:
    return round(value, 3)


def _local(at: datetime, zone: ZoneInfo) -> str:
    return at.astimezone(zone).isoformat(timespec="seconds")
