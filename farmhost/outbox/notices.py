"""Messages the host puts into the outbox for a chat: its own notices (plain text) and agents' answers."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from farmhost.outbox.chunking import split_text
from farmhost.store import outbox


def enqueue_notice(
    conn: sqlite3.Connection,
    *,
    key: str,
    jid: str,
    text: str,
    at: datetime,
    reply_markup: dict[str, Any] | None = None,
    reply_to: str | None = None,
) -> None:
    """Queue a host notice (command answer, approval, failure) as plain text: nothing in it is markup.

    `reply_to` is the key of an earlier message to the same chat: the notice goes as a reply to it once that one
    was sent (as a plain message when it never was).

    Raises:
        sqlite3.IntegrityError: `key` was queued before.
    """
    options: dict[str, Any] = {"format": "plain"}
    if reply_markup is not None:
        options["reply_markup"] = reply_markup
    if reply_to is not None:
        options["reply_to_key"] = reply_to
    outbox.enqueue(
        conn, message_key=key, chat_jid=jid, source_folder=None, chunks=split_text(text), at=at, options=options
    )


def enqueue_answer(conn: sqlite3.Connection, *, key: str, jid: str, folder: str, text: str, at: datetime) -> None:
    """Queue an agent's answer (its markdown becomes Telegram HTML on delivery).

    Raises:
        sqlite3.IntegrityError: `key` was queued before.
    """
    outbox.enqueue(conn, message_key=key, chat_jid=jid, source_folder=folder, chunks=split_text(text), at=at)
