"""ha_history: what entities did over a period, from Home Assistant's recorder, summarised (the morning report too).

The history comes over the WebSocket (`history/history_during_period`, minimal response, no attributes) on the
connection farmhost already keeps open, with HA's compressed rows (state and a float timestamp), a third of REST's
size for the same period. One entity at a time and the period in slices, each summarised as it arrives: a month
of 20 sensors reporting every second (tens of millions of rows, GB once decoded) never sits in memory at once,
and each command holds the shared connection only for its slice.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import InvalidRequest
from farmhost.farm.core_actions import require_ha
from farmhost.farm.state.history_summary import MAX_POINTS, Change, HistorySummary, summarise

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from zoneinfo import ZoneInfo

    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext
    from farmhost.protocol.params import HaHistoryParams

__all__ = ["MAX_POINTS", "Change", "entity_summaries", "ha_history", "history_period", "history_slices", "summarise"]

# SPEC §5: "a period of at most 31 days"; HA's recorder keeps 10 days unless its purge_keep_days says more.
MAX_PERIOD: Final = timedelta(days=31)
_RANGE: Final = "years 1-9999 in UTC, a day after the first"
DEFAULT_PERIOD: Final = timedelta(hours=24)  # "how long did the pump run?" means the last day unless said
# Slices of the period: the first an hour, doubling while a slice holds under half of SLICE_ROWS rows, up to a
# day (a switch or a 5-minute sensor: one command a day of the period), shrinking to hold about SLICE_ROWS when a
# sensor reports often (a 1 s sensor: 2-3 h slices). 10,000 rows are ~0.4 MB of JSON and ~4 MB decoded.
LONGEST_SLICE: Final = timedelta(days=1)
FIRST_SLICE: Final = timedelta(hours=1)
SHORTEST_SLICE: Final = timedelta(minutes=1)
SLICE_ROWS: Final = 10_000
# A slice asks up to a microsecond past its end, so a row exactly at the next slice's start (which HA's
# "after start" leaves out of that slice) is in this one; the next slice drops the rows it already had.
_OVERLAP: Final = timedelta(microseconds=1)


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
    entities = await entity_summaries(ha, wanted, start, end, zone)
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


async def entity_summaries(
    ha: HAClient,
    entity_ids: Sequence[str],
    start: datetime,
    end: datetime,
    zone: ZoneInfo,
    *,
    longest_slice: timedelta = LONGEST_SLICE,
) -> dict[str, dict[str, Any]]:
    """Each entity's summary over the period (see `HistorySummary`), fetched one entity and one slice at a time.

    The commands are sequential: another group's call to HA waits for one slice, not for the whole history.
    """
    out: dict[str, dict[str, Any]] = {}
    for entity in entity_ids:
        summary = HistorySummary(start, end)
        async for changes in history_slices(ha, entity, start, end, longest_slice=longest_slice):
            # A slice's arithmetic is ~30 ms at 10,000 rows: off the event loop, which serves every group meanwhile.
            await asyncio.to_thread(summary.feed, changes)
        out[entity] = await asyncio.to_thread(summary.result, zone)
    return out


async def history_slices(
    ha: HAClient, entity_id: str, start: datetime, end: datetime, *, longest_slice: timedelta = LONGEST_SLICE
) -> AsyncIterator[list[Change]]:
    """`entity_id`'s recorded states over the period, a slice at a time, the first beginning with the state at `start`.

    Together the slices hold what one command for the whole period would: the state held at `start`, then every
    change after it and before `end` (a row at a slice boundary once, rows HA repeats at a slice's start too).
    """
    length = min(FIRST_SLICE, longest_slice)
    begin, seen_until = start, None
    while begin < end:
        until = min(begin + length, end)
        asked_until = until + _OVERLAP if until < end else end
        raw = await ha.ws_command(
            "history/history_during_period",
            start_time=begin.isoformat(),
            end_time=asked_until.isoformat(),
            entity_ids=[entity_id],
            include_start_time_state=seen_until is None,
            significant_changes_only=False,
            minimal_response=True,
            no_attributes=True,
        )
        entries = raw.get(entity_id) if isinstance(raw, dict) else None
        rows = entries if isinstance(entries, list) else []
        yield await asyncio.to_thread(_changes, rows, seen_until)
        begin, seen_until = until, asked_until.timestamp()
        length = next_slice_length(length, len(rows), longest_slice)


def next_slice_length(length: timedelta, rows: int, longest: timedelta) -> timedelta:
    """The next slice's length after one of `length` held `rows` rows: aiming at SLICE_ROWS, at most doubling."""
    if rows > SLICE_ROWS:
        length = max(length * (SLICE_ROWS / rows), SHORTEST_SLICE)
    elif rows < SLICE_ROWS // 2:
        length *= 2
    return min(length, longest)


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


def _changes(entries: list[Any], seen_until: float | None) -> list[Change]:
    """HA's compressed rows as changes, without those updated before `seen_until` (the last slice had them)."""
    out: list[Change] = []
    for row in entries:
        if not isinstance(row, dict):
            continue
        updated = row.get("lu")
        if seen_until is not None and isinstance(updated, int | float) and updated < seen_until:
            continue
        stamp = row.get("lc", updated)
        if not isinstance(stamp, int | float):
            continue
        try:
            at = datetime.fromtimestamp(stamp, UTC)
        except (OverflowError, ValueError, OSError):
            continue  # not a time (HA writes its own clock's, but a restored database may hold anything)
        out.append(Change(at=at, state=str(row.get("s", ""))))
    return out


def _local(at: datetime, zone: ZoneInfo) -> str:
    return at.astimezone(zone).isoformat(timespec="seconds")
