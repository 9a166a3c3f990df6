"""One entity's history summarised as its rows stream in: memory that does not grow with the number of rows.

`HistorySummary` is fed the recorded states in time order, a slice at a time, and keeps only running sums, the
48 downsampling slices, the first 48 numeric spans and per-state seconds for at most 1,000 distinct states; what
it answers is what summarising all the rows at once answered (`summarise` is the one-batch case).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime
    from zoneinfo import ZoneInfo

# Two a hour over a day: enough to see a night's curve, small enough for a model's context at 20 entities.
MAX_POINTS: Final = 48
ON_STATES: Final = frozenset({"on", "open"})
OFF_STATES: Final = frozenset({"off", "closed"})
NO_VALUE: Final = frozenset({"unavailable", "unknown", ""})
_ON_OFF: Final = ON_STATES | OFF_STATES
# Text entities (a select, the weather) report time per state; a long-lived one may have had many.
MAX_TEXT_STATES: Final = 12
# Per-state seconds are exact up to this many distinct states (a select or a weather entity has tens); time in
# states first seen after them is `otherSeconds` (a text sensor holding ids or titles; ~300 KB at HA's 255 chars).
MAX_DISTINCT_STATES: Final = 1000
# The running sums add as the builtin sum() of the same seconds would: compensated from Python 3.12 on.
_COMPENSATED: Final = sys.version_info >= (3, 12)


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """One recorded state of an entity and when it began."""

    at: datetime
    state: str


class _Sum:
    """A running sum that ends exactly where `sum()` over the same floats in the same order would."""

    __slots__ = ("_c", "_n", "_total")

    def __init__(self) -> None:
        self._total, self._c, self._n = 0.0, 0.0, 0

    def add(self, x: float) -> None:
        self._n += 1
        t = self._total + x
        if _COMPENSATED:  # Neumaier, as CPython's sum()
            self._c += (self._total - t) + x if abs(self._total) >= abs(x) else (x - t) + self._total
        self._total = t

    def value(self) -> float:
        if not self._n:
            return 0  # sum([]) is the int 0
        return self._total + self._c if self._c and math.isfinite(self._c) else self._total


class HistorySummary:
    """The summary of one entity over [start, end], fed its recorded states in time order, one batch at a time.

    A state holds from its time until the next one (one recorded before `start` holds from `start`); a repeat of
    the state runs on; of rows at the same instant the last counts. A batch is sorted by time; a row in it earlier
    than the rows already fed (HA's `last_changed` of an attribute-only update, which repeats the state held)
    counts at the latest time already fed.
    """

    def __init__(self, start: datetime, end: datetime) -> None:
        self.start, self.end = start, end
        self._pending: Change | None = None  # the latest row: whether it opens a span waits for the next row's time
        self._open: tuple[str, datetime] | None = None  # the span running on (state, begin)
        self._spans = 0
        # what kind of entity, told by every state fed that has a value (as summarise looked at every row)
        self._valued, self._all_numbers, self._all_on_off = False, True, True
        self._no_value, self._on = _Sum(), _Sum()
        self._last_valued: str | None = None
        self._turned_on = 0
        self._per_state: dict[str, float] = {}
        self._other = _Sum()
        self._numbers = 0
        self._min = self._max = self._last_number = 0.0
        self._weight, self._weighted = _Sum(), _Sum()
        self._points: list[tuple[datetime, float]] = []
        self._origin, self._step = start.timestamp(), (end - start).total_seconds() / MAX_POINTS
        self._totals, self._weights = [0.0] * MAX_POINTS, [0.0] * MAX_POINTS

    def feed(self, changes: Iterable[Change]) -> None:
        """Add the next batch of rows (in time order after the rows fed before)."""
        for change in sorted(changes, key=lambda c: c.at):
            if change.state not in NO_VALUE:
                self._valued = True
                self._all_numbers = self._all_numbers and _number(change.state) is not None
                self._all_on_off = self._all_on_off and change.state in _ON_OFF
            if change.at > self.end:
                continue
            pending = self._pending
            if pending is not None:
                if change.at < pending.at:
                    change = Change(at=pending.at, state=change.state)
                if change.at > self.start and change.at != pending.at:  # else replaced before start, or at once
                    self._begin(pending)
            self._pending = change

    def result(self, zone: ZoneInfo) -> dict[str, Any]:
        """The summary (once, after the last batch): a number, on/off, or text entity, told by its states."""
        if self._pending is not None:
            self._begin(self._pending)  # the last row holds until `end`
            self._pending = None
        if self._open is not None:
            self._close(self.end)
        if not self._spans:
            return {"kind": "none", "changes": 0}
        assert self._open is not None
        last = self._open[0]
        base: dict[str, Any] = {"last": last, "changes": self._spans - 1}
        if no_value := self._no_value.value():
            base["unavailableSeconds"] = round(no_value)
        if self._valued and self._all_numbers:
            return {"kind": "number", **base, **self._number_summary(zone), "last": _number(last)}
        if self._valued and self._all_on_off:
            return {"kind": "on_off", **base, "onSeconds": round(self._on.value()), "turnedOn": self._turned_on}
        top = sorted(self._per_state.items(), key=lambda kv: -kv[1])[:MAX_TEXT_STATES]
        text = {"kind": "text", **base, "seconds": {state: round(seconds) for state, seconds in top}}
        if self._other.value():
            text["otherSeconds"] = round(self._other.value())
        return text

    # spans -------------------------------------------------------------------------------------------

    def _begin(self, change: Change) -> None:
        if self._open is not None and self._open[0] == change.state:
            return  # a repeat of the same state (an attribute-only row): the span runs on
        begin = max(change.at, self.start)
        if self._open is not None:
            self._close(begin)
        self._open = (change.state, begin)
        self._spans += 1

    def _close(self, until: datetime) -> None:
        assert self._open is not None
        state, begin = self._open
        seconds = (until - begin).total_seconds()
        if state in NO_VALUE:
            self._no_value.add(seconds)
        else:
            if state in ON_STATES:
                self._on.add(seconds)
            if state in ON_STATES and self._last_valued in OFF_STATES:
                self._turned_on += 1
            self._last_valued = state
        if state in self._per_state:
            self._per_state[state] += seconds
        elif len(self._per_state) < MAX_DISTINCT_STATES:
            self._per_state[state] = 0.0 + seconds
        else:
            self._other.add(seconds)
        if (value := _number(state)) is not None:
            self._add_number(value, begin, seconds)

    def _add_number(self, value: float, begin: datetime, seconds: float) -> None:
        self._numbers += 1
        if self._numbers == 1 or value < self._min:
            self._min = value
        if self._numbers == 1 or value > self._max:
            self._max = value
        self._last_number = value
        self._weight.add(seconds)
        self._weighted.add(value * seconds)
        if self._numbers <= MAX_POINTS:
            self._points.append((begin, value))
        # MAX_POINTS equal slices of the period, each the time-weighted mean of the values within it
        step = self._step
        lo = begin.timestamp() - self._origin
        hi = lo + seconds
        first, last = max(0, int(lo // step)), min(MAX_POINTS - 1, int(hi // step))
        for i in range(first, last + 1):
            overlap = min(hi, (i + 1) * step) - max(lo, i * step)
            if overlap > 0:
                self._totals[i] += value * overlap
                self._weights[i] += overlap

    def _number_summary(self, zone: ZoneInfo) -> dict[str, Any]:
        if not self._numbers:  # numbers recorded, none held within the period (replaced before it, or at once)
            return {"min": None, "max": None, "mean": None, "points": []}
        weight = self._weight.value()
        mean = self._weighted.value() / weight if weight > 0 else self._last_number
        if self._numbers <= MAX_POINTS:
            points = [[_local(begin, zone), value] for begin, value in self._points]
        else:
            points = [
                [_local(self.start + timedelta(seconds=self._step * i), zone), _round(total / weight_i)]
                for i, (total, weight_i) in enumerate(zip(self._totals, self._weights, strict=True))
                if weight_i > 0
            ]
        return {"min": self._min, "max": self._max, "mean": _round(mean), "points": points}


def summarise(changes: Iterable[Change], start: datetime, end: datetime, zone: ZoneInfo) -> dict[str, Any]:
    """One entity's summary over [start, end] from all its rows at once (see `HistorySummary`).

    A state holds from its time until the next one (the state at `start` from `start`); `unavailable` and
    `unknown` count as no value: they are left out of the mean and the on-time, and reported as such.
    """
    summary = HistorySummary(start, end)
    summary.feed(changes)
    return summary.result(zone)


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
