"""The llm_usage table: LLM requests and tokens per group per day (the farm's date), for the daily budgets."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

from farmhost.store.db import iso


@dataclass(frozen=True)
class DayUsage:
    """What a group used through the LLM proxy on one day."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


def day_usage(conn: sqlite3.Connection, folder: str, day: str) -> DayUsage:
    """The use of `folder` on `day` (`YYYY-MM-DD`); nothing used yet is all zeros."""
    row = conn.execute(
        "SELECT requests, prompt_tokens, completion_tokens FROM llm_usage WHERE folder = ? AND day = ?", (folder, day)
    ).fetchone()
    return DayUsage(*row) if row is not None else DayUsage()


def day_totals(conn: sqlite3.Connection, day: str) -> DayUsage:
    """The use of every group together on `day` (`YYYY-MM-DD`)."""
    row = conn.execute(
        "SELECT coalesce(sum(requests), 0), coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) "
        "FROM llm_usage WHERE day = ?",
        (day,),
    ).fetchone()
    return DayUsage(int(row[0]), int(row[1]), int(row[2]))


def folders_on(conn: sqlite3.Connection, day: str) -> list[str]:
    """The groups that used the LLM on `day`, by folder."""
    return [str(row[0]) for row in conn.execute("SELECT folder FROM llm_usage WHERE day = ? ORDER BY folder", (day,))]


def add_usage(
    conn: sqlite3.Connection,
    folder: str,
    day: str,
    *,
    at: datetime,
    requests: int = 0,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
) -> None:
    """Add to the use of `folder` on `day`."""
    conn.execute(
        "INSERT INTO llm_usage (folder, day, requests, prompt_tokens, completion_tokens, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(folder, day) DO UPDATE SET"
        " requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
        " completion_tokens = completion_tokens + excluded.completion_tokens, updated_at = excluded.updated_at",
        (folder, day, requests, prompt_tokens, completion_tokens, iso(at)),
    )


def prune_usage(conn: sqlite3.Connection, before_day: str) -> int:
    """Forget the days before `before_day`; returns how many rows went."""
    return conn.execute("DELETE FROM llm_usage WHERE day < ?", (before_day,)).rowcount
