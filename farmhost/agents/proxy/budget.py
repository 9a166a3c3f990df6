"""LlmBudgets: the LLM proxy's rations, a run's requests and a group's requests and tokens per day, persisted.

A request is reserved before its body is read, in one step on the event loop (check and count together), so any
number of concurrent requests with slow bodies cannot get past a request budget; a request that turns out to be bad
gives its reservation back. Once its body is known and before it goes upstream, it is committed: its bound in tokens
(proxy/tokens.py: a token a byte of its body, and its max_tokens) must fit in what the group's day has left beside
what requests in flight already hold, again in one step, else it is refused. The answer's `usage` settles the hold to
the real figures; an answer without one keeps the bound. So concurrent requests overrun the day only by what each one
in flight uses beyond its bound. The daily counts live in `llm_usage` (store/llm_usage.py) so a restart does not reset
them; holds live in memory, as their requests do. The day is the farm's calendar day (TZ).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from farmhost.agents.limits import LlmBudget
from farmhost.store.db import Database, now_utc
from farmhost.store.llm_usage import add_usage, day_usage, prune_usage

logger = logging.getLogger(__name__)

# Requests a run may make per allowed turn: a turn is one request, retries and the final answer need a few more.
REQUESTS_PER_TURN: Final = 4
# Daily rows older than this are of no use to a budget; a few weeks stay for an operator's questions.
KEEP_DAYS: Final = 35


@dataclass
class ProxyUsage:
    """What one run did through the proxy."""

    max_requests: int
    requests: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    upstream_failures: int = 0  # requests no endpoint answered (unreachable, timed out, 5xx)
    upstream_answers: int = 0  # requests an endpoint answered with 2xx (a stream: once its headers came)
    answered_by: dict[int, str] = field(default_factory=dict)  # endpoint number -> label, of those that answered 2xx
    # endpoint number -> label, of those that answered 2xx to a request whose photo they could not see (no vision)
    unseen_by: dict[int, str] = field(default_factory=dict)


class BudgetExceeded(Exception):
    """A budget is used up; `message` tells the agent which one and when it resets."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


@dataclass
class _Day:
    day: str
    requests: int  # forwarded and reserved ones
    tokens: int  # settled ones
    held: int = 0  # the bounds of requests sent and not settled yet


@dataclass
class Reservation:
    """One request's place in its run's and its group's budgets, until it is settled or given back."""

    folder: str
    day: str
    usage: ProxyUsage
    committed: bool = False
    released: bool = field(default=False, repr=False)
    prompt: int = 0  # the bound held while it is upstream (commit)
    completion: int = 0
    settled: bool = False


class LlmBudgets:
    """Reserves, commits and releases requests against the run's and the group's daily budgets."""

    def __init__(
        self,
        db: Database,
        *,
        zone: ZoneInfo,
        budget: Callable[[str], LlmBudget],
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        """Budgets on `db`; `budget(folder)` gives a group's daily budgets, `clock` the time (aware)."""
        self._db = db
        self._zone = zone
        self._budget = budget
        self._clock = clock
        self._days: dict[str, _Day] = {}
        self._store_failing = False

    def prune(self) -> None:
        """Forget days older than KEEP_DAYS."""
        oldest = (self._clock().astimezone(self._zone).date() - timedelta(days=KEEP_DAYS)).isoformat()
        with self._db.tx(durable=False) as conn:
            prune_usage(conn, oldest)

    def reserve(self, folder: str, usage: ProxyUsage) -> Reservation:
        """Take one request from the run's and the group's budgets (no await: nothing can slip in between).

        Raises:
            BudgetExceeded: the run's requests, or the group's requests or tokens today, are used up.
        """
        if usage.requests >= usage.max_requests:
            usage.refused += 1
            raise BudgetExceeded(
                f"this run has used all of its {usage.max_requests} LLM requests; "
                "stop calling tools and give your final answer",
                "run_request_limit",
            )
        now = self._clock()
        today = self._today(folder, now)
        budget = self._budget(folder)
        if today.requests >= budget.requests_per_day:
            usage.refused += 1
            raise BudgetExceeded(
                f"group {folder} has used its daily budget of {budget.requests_per_day} LLM requests; "
                f"it resets {self._reset_text(now)}. Stop calling tools and give your final answer",
                "daily_request_limit",
            )
        if today.tokens >= budget.tokens_per_day:
            usage.refused += 1
            raise BudgetExceeded(
                f"group {folder} has used its daily budget of {budget.tokens_per_day} LLM tokens "
                f"({today.tokens} used); it resets {self._reset_text(now)}. Stop calling tools and give your "
                "final answer",
                "daily_token_limit",
            )
        today.requests += 1
        usage.requests += 1
        return Reservation(folder=folder, day=today.day, usage=usage)

    def release(self, reservation: Reservation) -> None:
        """The exchange is over: give back a request never sent; one sent and not settled is charged its bound."""
        if reservation.committed:
            self.settle(reservation, None)
            return
        if reservation.released:
            return
        reservation.released = True
        reservation.usage.requests -= 1
        day = self._days.get(reservation.folder)
        if day is not None and day.day == reservation.day:
            day.requests -= 1

    def commit(self, reservation: Reservation, *, prompt: int, completion: int) -> None:
        """The request is being sent upstream: hold its bound in tokens and count it in the group's day for good.

        Args:
            reservation: the request's place, from `reserve`.
            prompt: the most prompt tokens it may cost (proxy/tokens.py).
            completion: its max_tokens.

        Raises:
            BudgetExceeded: the bound does not fit in what the day has left beside what requests in flight hold.
        """
        now = self._clock()
        today = self._today(reservation.folder, now)
        budget = self._budget(reservation.folder)
        if today.tokens + today.held + prompt + completion > budget.tokens_per_day:
            reservation.usage.refused += 1
            raise BudgetExceeded(
                f"this request may use up to {prompt + completion} LLM tokens ({prompt} for its prompt, a token a "
                f"byte of its body, and {completion} of max_tokens), more than group {reservation.folder} has left "
                f"of its daily budget of {budget.tokens_per_day} LLM tokens ({today.tokens} used, {today.held} held "
                "by requests under way); send a shorter conversation or a lower max_tokens, or stop calling tools "
                f"and give your final answer. It resets {self._reset_text(now)}",
                "daily_token_limit",
            )
        if reservation.day != today.day:  # midnight passed while its body arrived: it is the new day's request
            reservation.day = today.day
            today.requests += 1
        reservation.committed = True
        reservation.prompt, reservation.completion = prompt, completion
        today.held += prompt + completion
        self._record(reservation, requests=1)

    def settle(self, reservation: Reservation, used: tuple[int, int] | None, *, given_up: int = 0) -> None:
        """Replace a sent request's hold by what it used: the upstream's prompt and completion tokens, else its bound.

        `given_up`: endpoints that took the request and were given up on before another answered (or none did);
        each may have done the work and is charged the bound too.
        """
        if not reservation.committed or reservation.settled:
            return
        reservation.settled = True
        prompt, completion = used if used is not None else (reservation.prompt, reservation.completion)
        prompt += given_up * reservation.prompt
        completion += given_up * reservation.completion
        usage = reservation.usage
        usage.prompt_tokens += prompt
        usage.completion_tokens += completion
        day = self._days.get(reservation.folder)
        if day is not None and day.day == reservation.day:
            day.held -= reservation.prompt + reservation.completion
            day.tokens += prompt + completion
        self._record(reservation, prompt_tokens=prompt, completion_tokens=completion)

    def _record(self, reservation: Reservation, **counts: int) -> None:
        """Add to the stored day; a store that fails (disk full, locked) leaves the budget counted in memory only."""
        try:
            with self._db.tx(durable=False) as conn:
                add_usage(conn, reservation.folder, reservation.day, at=self._clock(), **counts)
        except sqlite3.Error as err:
            if not self._store_failing:
                self._store_failing = True
                logger.error("llm budgets: cannot record use in the database (%s); counting in memory only", err)
            return
        if self._store_failing:
            self._store_failing = False
            logger.info("llm budgets: recording use in the database again")

    def _today(self, folder: str, now: datetime) -> _Day:
        day = now.astimezone(self._zone).date().isoformat()
        cached = self._days.get(folder)
        if cached is None or cached.day != day:
            stored = day_usage(self._db.conn, folder, day)
            cached = self._days[folder] = _Day(day=day, requests=stored.requests, tokens=stored.tokens)
        return cached

    def _reset_text(self, now: datetime) -> str:
        local = now.astimezone(self._zone)
        midnight = datetime.combine(local.date() + timedelta(days=1), time(0), tzinfo=self._zone)
        minutes = max(1, int((midnight - local).total_seconds() // 60))
        return f"at midnight {self._zone.key} ({midnight.isoformat()}), in {minutes // 60} h {minutes % 60} min"
