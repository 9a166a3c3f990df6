"""LlmBudgets on a real database with the time passed in: the day boundary, what a refusal says, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from farmhost.agents.limits import LlmBudget
from farmhost.agents.proxy.budget import BudgetExceeded, LlmBudgets, ProxyUsage
from farmhost.store.db import Database
from farmhost.store.llm_usage import day_usage

LISBON = ZoneInfo("Europe/Lisbon")


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.open(tmp_path)
    yield database
    database.close()


def budgets(db: Database, clock: Clock, requests: int = 2, tokens: int = 1000) -> LlmBudgets:
    budget = LlmBudget(requests_per_day=requests, tokens_per_day=tokens)
    return LlmBudgets(db, zone=LISBON, budget=lambda folder: budget, clock=clock)


def test_the_daily_budget_resets_at_the_farms_midnight_and_says_when(db: Database) -> None:
    clock = Clock(datetime(2026, 7, 1, 20, 30, tzinfo=UTC))  # 21:30 in Lisbon (summer time)
    rations = budgets(db, clock)
    run = ProxyUsage(max_requests=10)
    for _ in range(2):
        rations.commit(rations.reserve("field", run), prompt=0, completion=0)
    with pytest.raises(BudgetExceeded) as caught:
        rations.reserve("field", run)
    assert caught.value.kind == "daily_request_limit"
    assert caught.value.message.startswith(
        "group field has used its daily budget of 2 LLM requests; it resets at midnight Europe/Lisbon "
        "(2026-07-02T00:00:00+01:00), in 2 h 30 min."
    )
    rations.reserve("barn", run)  # another group has its own day
    clock.now = datetime(2026, 7, 1, 23, 0, tzinfo=UTC)  # midnight in Lisbon, still July 1st in UTC
    rations.reserve("field", run)
    assert day_usage(db.conn, "field", "2026-07-01").requests == 2


def test_a_restart_keeps_the_days_count_and_a_released_request_gives_its_place_back(db: Database) -> None:
    clock = Clock(datetime(2026, 12, 2, 10, 0, tzinfo=UTC))
    first = budgets(db, clock, requests=3, tokens=50)
    run = ProxyUsage(max_requests=10)
    sent = first.reserve("field", run)
    first.commit(sent, prompt=20, completion=20)
    first.settle(sent, (30, 10))
    first.release(first.reserve("field", run))  # a bad body: never sent
    assert run.requests == 1 and (run.prompt_tokens, run.completion_tokens) == (30, 10)
    again = budgets(db, clock, requests=3, tokens=50)  # the daemon started again
    again.commit(again.reserve("field", ProxyUsage(max_requests=10)), prompt=0, completion=0)
    crossing = again.reserve("field", ProxyUsage(max_requests=10))
    again.commit(crossing, prompt=5, completion=5)
    again.settle(crossing, (15, 0))  # it used more than its bound and crossed 50: the next one is refused
    with pytest.raises(BudgetExceeded) as caught:
        again.reserve("field", ProxyUsage(max_requests=10))
    assert caught.value.kind == "daily_request_limit"  # the first one counts: the day survived the restart
    stored = day_usage(db.conn, "field", "2026-12-02")
    assert (stored.requests, stored.tokens) == (3, 55)


def test_the_token_budget_refuses_once_it_is_reached(db: Database) -> None:
    clock = Clock(datetime(2026, 12, 2, 10, 0, tzinfo=UTC))
    rations = budgets(db, clock, requests=100, tokens=50)
    run = ProxyUsage(max_requests=10)
    sent = rations.reserve("field", run)
    rations.commit(sent, prompt=10, completion=10)
    rations.settle(sent, (40, 10))
    with pytest.raises(BudgetExceeded) as caught:
        rations.reserve("field", run)
    assert caught.value.kind == "daily_token_limit"
    assert "daily budget of 50 LLM tokens (50 used); it resets at midnight Europe/Lisbon" in caught.value.message
    assert run.refused == 1


def test_requests_in_flight_hold_their_bound_until_their_usage_settles_it(db: Database) -> None:
    clock = Clock(datetime(2026, 12, 2, 10, 0, tzinfo=UTC))
    rations = budgets(db, clock, requests=100, tokens=100)
    run = ProxyUsage(max_requests=10)
    first, second, third = (rations.reserve("field", run) for _ in range(3))
    rations.commit(first, prompt=30, completion=10)
    rations.commit(second, prompt=30, completion=10)
    with pytest.raises(BudgetExceeded) as caught:
        rations.commit(third, prompt=30, completion=10)  # 80 held, 40 more does not fit in 100
    assert caught.value.kind == "daily_token_limit"
    assert caught.value.message.startswith(
        "this request may use up to 40 LLM tokens (30 for its prompt, a token a byte of its body, and 10 of "
        "max_tokens), more than group field has left of its daily budget of 100 LLM tokens (0 used, 80 held by "
        "requests under way)"
    )
    rations.release(third)
    rations.settle(first, (5, 1))  # its answer's usage replaces its bound
    rations.commit(rations.reserve("field", run), prompt=30, completion=10)  # 6 used, 40 + 40 held
    rations.release(second)  # ended without usage (a cut stream): charged its bound
    assert (run.requests, run.refused, run.prompt_tokens, run.completion_tokens) == (3, 1, 35, 11)
    assert day_usage(db.conn, "field", "2026-12-02").tokens == 46
