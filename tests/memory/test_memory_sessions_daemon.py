"""memory_search's chat part through the real daemon: new messages, whose chat a group sees, the CLI re-binding it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from farmhost_testing import FIELD_JID, MAIN_JID, Daemon, drop, farmhost, ok, refused, wait_result

from farmhost.store import transcripts
from farmhost.store.db import Database, now_utc

_ids = itertools.count()


def search(data_dir: Path, folder: str, params: dict[str, Any]) -> dict[str, Any]:
    rid = f"mss-{next(_ids)}"
    payload = {"type": "memory_action", "action": "memory_search", "params": params, "requestId": rid}
    drop(data_dir, folder, "actions", payload)
    return wait_result(data_dir, folder, rid)


def post(data_dir: Path, jid: str, text: str) -> None:
    """A message in a chat's transcript, written on a connection of its own (as Telegram's side would be)."""
    db = Database.open(data_dir)
    try:
        with db.tx() as conn:
            transcripts.append(conn, chat_jid=jid, direction="in", sender="ana", text=text, at=now_utc())
    finally:
        db.close()


def chats(result: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((h["chatJid"], h["snippet"]) for h in ok(result)["hits"] if h["source"] == "session")


def test_new_messages_are_found_and_each_group_sees_only_its_own_chat(data_dir: Path, daemon: Daemon) -> None:
    post(data_dir, FIELD_JID, "the borehole pump tripped")
    post(data_dir, MAIN_JID, "office borehole invoice paid")
    assert chats(search(data_dir, "field", {"query": "borehole"})) == [(FIELD_JID, "the borehole pump tripped")]
    post(data_dir, FIELD_JID, "borehole pump reset by rui")
    assert chats(search(data_dir, "field", {"query": "borehole", "sources": "sessions"})) == [
        (FIELD_JID, "borehole pump reset by rui"),
        (FIELD_JID, "the borehole pump tripped"),
    ], "a message posted after the first search is found by the next"
    for params in ({"groupFolder": "main"}, {"groupFolder": "main", "sources": "sessions"}):
        refused(search(data_dir, "field", {"query": "borehole", **params}), "unauthorized", "its own memory")
    assert chats(search(data_dir, "main", {"query": "borehole"})) == [(MAIN_JID, "office borehole invoice paid")]
    assert [c for c, _ in chats(search(data_dir, "main", {"query": "borehole", "groupFolder": "field"}))] == [
        FIELD_JID,
        FIELD_JID,
    ], "main reads a registered group's chat, and only that one"
    assert chats(search(data_dir, "main", {"query": "borehole", "groupFolder": "global"})) == []


def test_the_cli_moving_a_chat_to_another_folder_moves_its_messages(data_dir: Path, daemon: Daemon) -> None:
    post(data_dir, FIELD_JID, "silo sensor offline")
    assert chats(search(data_dir, "main", {"query": "silo", "groupFolder": "field"})) == [
        (FIELD_JID, "silo sensor offline")
    ]
    assert farmhost("group", "remove", "field", data_dir=data_dir).returncode == 0
    refused(search(data_dir, "main", {"query": "silo", "groupFolder": "field"}), "not_found", "not a registered")
    added = farmhost("group", "add", "--jid", FIELD_JID, "--name", "Silo", "--folder", "silo", data_dir=data_dir)
    assert added.returncode == 0, added.stderr
    assert chats(search(data_dir, "main", {"query": "silo", "groupFolder": "silo"})) == [
        (FIELD_JID, "silo sensor offline")
    ]
    added = farmhost("group", "add", "--jid", "telegram:300", "--name", "Field", "--folder", "field", data_dir=data_dir)
    assert added.returncode == 0, added.stderr
    assert chats(search(data_dir, "main", {"query": "silo", "groupFolder": "field"})) == [], "a new chat, no history"
