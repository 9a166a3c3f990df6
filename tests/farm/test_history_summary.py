"""The streaming history summary against the one it replaced: the same answer, slice by slice, in bounded memory.

`_reference_summarise` and its helpers are farmhost's summarise before the history was fetched in slices (commit
2b52759), copied verbatim: the accumulator must answer exactly what it answered for the same rows, however the
rows are cut into slices, and hold no more memory for two million rows than for a tenth of them.
"""

from __future__ import annotations

import json
import math
import random
import tracemalloc
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from farmhost.farm.state.history import SLICE_ROWS, next_slice_length
from farmhost.farm.state.history_summary import (
    MAX_DISTINCT_STATES,
    MAX_POINTS,
    MAX_TEXT_STATES,
    NO_VALUE,
    OFF_STATES,
    ON_STATES,
    Change,
    HistorySummary,
)

ZONE = ZoneInfo("Europe/Amsterdam")
BASE = datetime(2026, 12, 4, 6, 0, tzinfo=UTC)


# the summarise farmhost had before (verbatim but for the names) -----------------------------------------------
def _reference_summarise(changes: Sequence[Change], start: datetime, end: datetime, zone: ZoneInfo) -> dict[str, Any]:
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


# random histories -----------------------------------------------------------------------------------------------

_KINDS: dict[str, list[str]] = {
    "number": ["1", "2.5", "-3", "0", "-0.0", "1e3", "20.25", "7"],
    "on_off": ["on", "off", "open", "closed"],
    "text": ["sunny", "rainy", "cloudy", "eco", "boost", "on", "3", "night", "day", "snow", "fog", "hail", "x", "y"],
    "none": [],
}


def _history(rng: random.Random) -> tuple[list[Change], datetime, datetime]:
    """Rows in time order (ties in any order), some before `start`, at it, at the same instant, at `end`, after it."""
    start = BASE + timedelta(microseconds=rng.randrange(10**9))
    end = start + rng.choice(
        [timedelta(seconds=1), timedelta(minutes=rng.randrange(1, 600)), timedelta(days=rng.choice([1, 10, 31]))]
    )
    kind = rng.choice(list(_KINDS))
    pool = _KINDS[kind] + rng.choice([[], ["unavailable"], ["unavailable", "unknown", ""]])
    if not pool:
        pool = ["unavailable"]
    n = rng.choice([0, 1, 2, rng.randrange(3, MAX_POINTS + 1), MAX_POINTS, MAX_POINTS + 1, rng.randrange(49, 400)])
    span = end - start
    instants = [start + span * rng.random() for _ in range(max(1, n // 3))]  # shared, for same-instant rows
    changes = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.1:
            at = start - timedelta(seconds=rng.randrange(1, 10**6))
        elif roll < 0.15:
            at = start
        elif roll < 0.2:
            at = end
        elif roll < 0.22:
            at = end + timedelta(seconds=rng.randrange(1, 100))
        elif roll < 0.4:
            at = rng.choice(instants)
        else:
            at = start + span * rng.random()
        changes.append(Change(at=at.replace(microsecond=at.microsecond), state=rng.choice(pool)))
    changes.sort(key=lambda c: c.at)
    return changes, start, end


def _sliced(rng: random.Random, changes: list[Change], end: datetime) -> list[list[Change]]:
    """The rows cut into slices (some empty), each with what HA may add at a slice's start.

    That is a repeat of the state held, and a row stamped when the held state began (a `last_changed`).
    """
    cuts = sorted(rng.randrange(len(changes) + 1) for _ in range(rng.randrange(0, 8)))
    out = []
    for a, b in pairwise([0, *cuts, len(changes)]):
        held = [c for c in changes[:a] if c.at <= end]
        extra: list[Change] = []
        if held and rng.random() < 0.5:
            last = held[-1]
            upto = min(changes[a].at, end) if a < len(changes) else end
            at = last.at + (upto - last.at) * rng.choice([0, 1, rng.random()])
            if not (a < len(changes) and at == changes[a].at and rng.random() < 0.5):
                extra.append(Change(at=at, state=last.state))  # the state held, repeated within its span
        if held and rng.random() < 0.3:
            run = len(held) - 1
            while run > 0 and held[run - 1].state == held[-1].state:
                run -= 1
            extra.append(Change(at=held[run].at, state=held[-1].state))  # earlier than rows already fed
        out.append(extra + changes[a:b])
    return out


def _summary(slices: Sequence[Sequence[Change]], start: datetime, end: datetime) -> dict[str, Any]:
    summary = HistorySummary(start, end)
    for piece in slices:
        summary.feed(piece)
    return summary.result(ZONE)


def test_the_streamed_summary_is_what_summarising_every_row_at_once_answered() -> None:
    compared = raised = 0
    kinds: set[str] = set()
    downsampled = 0
    for seed in range(2000):
        rng = random.Random(seed)
        changes, start, end = _history(rng)
        try:
            expected = _reference_summarise(changes, start, end, ZONE)
        except (ValueError, IndexError):  # numbers recorded, none held within the period: the old code crashed
            raised += 1
            got = _summary(_sliced(rng, changes, end), start, end)
            assert got["kind"] == "number" and got["min"] is None and got["points"] == [], seed
            continue
        got = _summary(_sliced(rng, changes, end), start, end)
        # the same dict, keys in the same order (the JSON the agent reads)
        assert json.dumps(got) == json.dumps(expected), (seed, changes, start, end)
        compared += 1
        kinds.add(expected["kind"])
        downsampled += expected["kind"] == "number" and expected["changes"] >= MAX_POINTS
    assert compared > 1900 and kinds == {"number", "on_off", "text", "none"} and downsampled > 30
    assert raised < 100


@pytest.mark.parametrize("distinct", [MAX_DISTINCT_STATES - 1, MAX_DISTINCT_STATES + 500])
def test_text_seconds_are_exact_up_to_the_distinct_state_cap_and_the_rest_is_other(distinct: int) -> None:
    start = BASE
    end = start + timedelta(seconds=distinct * 10)
    # state i held 10 s, except a few held longer; "unavailable" once in a while
    changes = [Change(at=start + timedelta(seconds=10 * i), state=f"track {i}") for i in range(distinct)]
    changes[5] = Change(at=changes[5].at, state="unavailable")
    expected = _reference_summarise(changes, start, end, ZONE)
    got = _summary([changes[i : i + 97] for i in range(0, distinct, 97)], start, end)
    if distinct <= MAX_DISTINCT_STATES:
        assert got == expected
        return
    assert len(got["seconds"]) == MAX_TEXT_STATES and "otherSeconds" in got
    kept = sum(10 for i in range(MAX_DISTINCT_STATES))
    assert got["otherSeconds"] == distinct * 10 - kept  # every second is somewhere: the tracked states or other
    assert {k: v for k, v in got.items() if k not in ("seconds", "otherSeconds")} == {
        k: v for k, v in expected.items() if k != "seconds"
    }


def test_on_off_with_unknowns_in_between_counts_no_turn_on_across_them() -> None:
    start = BASE
    states = ["off", "unknown", "off", "on", "unavailable", "on", "", "off", "closed", "open"]
    changes = [Change(at=start + timedelta(minutes=i), state=s) for i, s in enumerate(states)]
    got = _summary([changes[:3], changes[3:3], changes[3:]], start, start + timedelta(hours=1))
    assert got == _reference_summarise(changes, start, start + timedelta(hours=1), ZONE)
    assert got["turnedOn"] == 2 and got["kind"] == "on_off"


def _sensor(rows: int, per_slice: int) -> Iterator[list[Change]]:
    """A sensor reporting every second, a few thousand distinct values and now and then unavailable."""
    states = [f"{i / 10:.1f}" for i in range(3000)] + ["unavailable"]
    second = timedelta(seconds=1)
    for first in range(0, rows, per_slice):
        yield [
            Change(at=BASE + second * i, state=states[(i * 7919) % len(states)])
            for i in range(first, min(rows, first + per_slice))
        ]


def _peak(rows: int) -> tuple[int, dict[str, Any]]:
    tracemalloc.start()
    try:
        summary = HistorySummary(BASE, BASE + timedelta(seconds=rows))
        for piece in _sensor(rows, per_slice=1000):
            summary.feed(piece)
        result = summary.result(ZONE)
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_number_of_rows() -> None:
    small, small_result = _peak(4_000)
    large, large_result = _peak(40_000)
    assert small_result["changes"] == 4_000 - 1 and large_result["changes"] == 40_000 - 1
    assert len(large_result["points"]) == MAX_POINTS
    # the same few hundred KB (the per-state cap reached in both, a slice of rows, the 48 slices): 10x the rows,
    # not 10x the memory; all the rows at once were ~300 bytes each
    assert large < 1.3 * small, (small, large)
    assert large < 40_000 * 100, large


def test_a_slice_grows_while_rows_are_few_and_shrinks_to_about_slice_rows() -> None:
    hour, day = timedelta(hours=1), timedelta(days=1)
    assert next_slice_length(hour, 10, day) == 2 * hour
    assert next_slice_length(16 * hour, 10, day) == day
    assert next_slice_length(hour, SLICE_ROWS, day) == hour
    assert next_slice_length(hour, 4 * SLICE_ROWS, day) == hour / 4
    assert next_slice_length(hour, 10**9, day) == timedelta(minutes=1)
    assert next_slice_length(timedelta(seconds=1), 0, timedelta(seconds=1)) == timedelta(seconds=1)
