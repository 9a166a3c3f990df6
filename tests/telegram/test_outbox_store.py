"""The outbox store on a real SQLite file: heads per chat, sent / retry / failed transitions, options."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from farmhost.store import outbox
from farmhost.store.db import Database

NOW = datetime(2026, 5, 17, 6, 0, tzinfo=UTC)
KEYBOARD = {"inline_keyboard": [[{"text": "Approve", "callback_data": "approve:1"}]]}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database.open(tmp_path)
    yield database
    database.close()


def queue(db: Database, key: str, chat: str, chunks: list[str], **kwargs: Any) -> list[outbox.OutboxEntry]:
    with db.tx() as conn:
        outbox.enqueue(conn, message_key=key, chat_jid=chat, source_folder="main", chunks=chunks, at=NOW, **kwargs)
    return [e for e in outbox.list_entries(db.conn) if e.message_key == key]


def test_options_are_stored_and_the_keyboard_goes_with_the_last_chunk_only(db: Database) -> None:
    first, last = queue(db, "m1", "telegram:1", ["a", "b"], options={"reply_markup": KEYBOARD, "format": "plain"})
    assert first.options == {"format": "plain"}
    assert last.options == {"reply_markup": KEYBOARD, "format": "plain"}
    (bare,) = queue(db, "m2", "telegram:1", ["c"])
    assert bare.options == {} and bare.telegram_message_id is None and bare.next_attempt_at == NOW
    with db.tx() as conn:
        outbox.set_options(conn, bare.id, {"format": "plain"})
    entry = outbox.get_entry(db.conn, bare.id)
    assert entry is not None and entry.options == {"format": "plain"}
    assert outbox.get_entry(db.conn, 999) is None


def test_unreadable_options_are_ignored(db: Database) -> None:
    (entry,) = queue(db, "m1", "telegram:1", ["a"])
    db.conn.execute("UPDATE outbox SET options = '[not json' WHERE id = ?", (entry.id,))
    again = outbox.get_entry(db.conn, entry.id)
    assert again is not None and again.options == {}


def test_each_chat_has_one_head_the_oldest_pending_entry(db: Database) -> None:
    a1, a2 = queue(db, "a", "telegram:1", ["a1", "a2"])
    (b1,) = queue(db, "b", "telegram:2", ["b1"])
    assert [e.id for e in outbox.chat_heads(db.conn)] == [a1.id, b1.id]
    with db.tx() as conn:
        assert outbox.mark_sent(conn, a1.id, telegram_message_id=77, at=NOW)
        assert not outbox.mark_sent(conn, a1.id, telegram_message_id=78, at=NOW)  # never twice
    head = outbox.chat_head(db.conn, "telegram:1")
    assert head is not None and head.id == a2.id
    sent = outbox.get_entry(db.conn, a1.id)
    assert sent is not None and sent.status == "sent" and sent.telegram_message_id == 77 and sent.sent_at == NOW
    assert [e.id for e in outbox.chat_heads(db.conn)] == [a2.id, b1.id]
    assert outbox.chat_head(db.conn, "telegram:3") is None


def test_retries_count_only_when_asked_and_keep_the_error(db: Database) -> None:
    (entry,) = queue(db, "m", "telegram:1", ["x"])
    later = NOW + timedelta(seconds=30)
    with db.tx() as conn:
        outbox.schedule_retry(conn, entry.id, next_attempt_at=later, error="flood", count_attempt=False)
        outbox.schedule_retry(conn, entry.id, next_attempt_at=later, error="HTTP 500", count_attempt=True)
    again = outbox.get_entry(db.conn, entry.id)
    assert again is not None
    assert (again.status, again.attempts, again.last_error, again.next_attempt_at) == ("pending", 1, "HTTP 500", later)


def test_a_failed_chunk_fails_the_rest_of_its_message_but_not_other_messages(db: Database) -> None:
    c1, c2, c3 = queue(db, "m", "telegram:1", ["1", "2", "3"])
    (other,) = queue(db, "n", "telegram:1", ["other"])
    with db.tx() as conn:
        assert outbox.mark_sent(conn, c1.id, telegram_message_id=1, at=NOW)
        assert outbox.mark_failed(conn, c2, error="Bad Request: chat not found") == 2
    rows = {e.id: e for e in outbox.list_entries(db.conn)}
    assert (rows[c1.id].status, rows[c2.id].status, rows[c3.id].status) == ("sent", "failed", "failed")
    assert rows[c2.id].attempts == 1 and rows[c2.id].last_error == "Bad Request: chat not found"
    assert rows[c3.id].last_error == "chunk 2/3 of this message failed: Bad Request: chat not found"
    assert rows[other.id].status == "pending"
    assert [e.id for e in outbox.list_entries(db.conn, status="failed")] == [c2.id, c3.id]
    assert outbox.count_by_status(db.conn) == {"sent": 1, "failed": 2, "pending": 1}


def test_pending_entries_older_than_a_moment_are_counted(db: Database) -> None:
    queue(db, "old", "telegram:1", ["x", "y"])
    assert outbox.count_pending_since(db.conn, NOW + timedelta(minutes=1)) == 2
    assert outbox.count_pending_since(db.conn, NOW) == 0
