"""The transcript queries memory_search uses, on a real database: windows, new rows only, counts, index plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from farmhost.store import transcripts
from farmhost.store.db import Database

T0 = datetime(2026, 5, 17, 6, 0, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database.open(tmp_path)
    with database.tx() as conn:
        for n in range(12):
            transcripts.append(
                conn,
                chat_jid=f"telegram:{n % 3}",
                direction="in",
                sender=f"s{n}",
                text=f"message {n}",
                at=T0 + timedelta(seconds=n),
            )
    return database


def test_latest_is_the_newest_messages_of_the_chats_oldest_first(db: Database) -> None:
    rows = transcripts.latest(db.conn, ["telegram:1"], limit=3)
    assert [r.text for r in rows] == ["message 4", "message 7", "message 10"]
    assert rows[0].sent_at == "2026-05-17T06:00:04.000+00:00", "the stored text, not parsed"
    assert [r.text for r in transcripts.latest(db.conn, ["telegram:0", "telegram:2"], limit=3)] == [
        "message 8",
        "message 9",
        "message 11",
    ]
    assert transcripts.latest(db.conn, [], limit=3) == []


def test_since_gives_only_rows_after_an_id_of_those_chats(db: Database) -> None:
    every = transcripts.latest(db.conn, ["telegram:1"])
    assert [r.id for r in transcripts.since(db.conn, ["telegram:1"], every[1].id, limit=10)] == [
        r.id for r in every[2:]
    ]
    assert [r.id for r in transcripts.since(db.conn, ["telegram:1"], 0, limit=2)] == [r.id for r in every[:2]]
    assert transcripts.since(db.conn, ["telegram:1"], every[-1].id, limit=10) == []
    assert transcripts.since(db.conn, [], 0, limit=10) == []


def test_count_between_counts_the_chats_rows_in_an_id_range(db: Database) -> None:
    ids = [r.id for r in transcripts.latest(db.conn, ["telegram:2"])]
    assert transcripts.count_between(db.conn, ["telegram:2"], ids[0], ids[-1]) == 4
    assert transcripts.count_between(db.conn, ["telegram:2"], ids[1], ids[2]) == 2
    db.conn.execute("DELETE FROM transcript WHERE id = ?", (ids[1],))
    assert transcripts.count_between(db.conn, ["telegram:2"], ids[0], ids[-1]) == 3


def test_the_queries_walk_the_chat_id_index(db: Database) -> None:
    """A chat with years of history must not be scanned: new rows are an index range, the window a reverse walk."""
    executed: list[str] = []
    db.conn.set_trace_callback(executed.append)  # the statements as run, with their values bound
    transcripts.since(db.conn, ["telegram:1"], 3, limit=5)
    transcripts.latest(db.conn, ["telegram:1"], limit=5)
    transcripts.count_between(db.conn, ["telegram:1"], 1, 9)
    db.conn.set_trace_callback(None)
    assert len(executed) == 3
    for sql in executed:
        plan = [row[3] for row in db.conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
        walks = [step for step in plan if "transcript_chat_id" in step]
        assert walks and not any("SCAN transcript" in step for step in plan), (sql, plan)
    since_plan = " ".join(row[3] for row in db.conn.execute(f"EXPLAIN QUERY PLAN {executed[0]}"))
    assert "id>?" in since_plan and "TEMP B-TREE" not in since_plan, since_plan
