"""Operator commands over the fake Bot API: /help everywhere, /status and /tasks in the main chat only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from inbound_support import FIELD_CHAT, MAIN_CHAT, new_data_dir, prompts, running, settings_for, until, wait_sent
from telegram_stub import FakeTelegram

from farmhost.store import outbox, task_runs, tasks
from farmhost.store.db import Database
from farmhost.store.tasks import Task

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


def seed(root: Path) -> None:
    """Two tasks (one paused, one with a failed run) and one failed outbox entry."""
    db = Database.open(root)
    try:
        with db.tx() as conn:
            for task_id, folder, status, next_run in (
                ("morning-tanks", "main", "active", datetime(2026, 12, 1, 7, 0, tzinfo=UTC)),
                ("frost-watch", "field", "paused", None),
            ):
                tasks.insert_task(
                    conn,
                    Task(id=task_id, group_folder=folder, prompt=f"check the {task_id}\nand report", schedule_type="cron",
                         schedule_value="0 7 * * *", context_mode="isolated", status=status, next_run=next_run,
                         last_run=None, anchor=NOW, created_at=NOW, created_by=folder),
                )  # fmt: skip
            task_runs.insert_run(conn, task_id="morning-tanks", due_at=NOW, at=NOW, status="error", detail="boom")
            outbox.enqueue(conn, message_key="old", chat_jid="telegram:1", source_folder=None, chunks=["x"], at=NOW)
            conn.execute("UPDATE outbox SET status = 'failed'")
    finally:
        db.close()


async def status_source() -> dict[str, Any]:
    return {"home_assistant": "up", "version": "0.1.0", "started_at": datetime.now(UTC) - timedelta(hours=3, minutes=5)}


async def test_status_and_tasks_in_the_main_chat(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    seed(root)
    async with running(settings_for(root, tg), deliver=True, status=status_source):
        tg.user_message(MAIN_CHAT, "/status")
        tg.user_message(MAIN_CHAT, "/tasks@farm_test_bot")
        status, listing = await wait_sent(tg, 2, MAIN_CHAT)
    assert status.text == (
        "Farm status (farmhost 0.1.0, up 3 h 5 min)\n"
        "Home Assistant: up\n"
        "Agents: 0 running, 0 queued\n"
        "Outbox: 0 waiting, 1 failed (see `farmhost outbox list`)\n"
        "Tasks: 1 active"
    )
    assert status.params.get("parse_mode") is None  # plain text: nothing to escape or misparse
    assert listing.text == (
        "Scheduled tasks (2):\n"
        "• morning-tanks (main): cron 0 7 * * *; next Tue 01 Dec 07:00; last error\n"
        "  check the morning-tanks and report\n"
        "• frost-watch (field) [paused]: cron 0 7 * * *; next none; last never run\n"
        "  check the frost-watch and report"
    )
    assert prompts(root, "main") == []  # commands never start a run


async def test_help_everywhere_operator_commands_refused_outside_main(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True) as host:
        tg.user_message(FIELD_CHAT, "/help")
        tg.user_message(FIELD_CHAT, "/status")
        tg.user_message(FIELD_CHAT, "/tasks@farm_test_bot please")
        field_help, status, listing = await wait_sent(tg, 3, FIELD_CHAT)
        tg.user_message(MAIN_CHAT, "/help@FARM_TEST_BOT")
        [main_help] = await wait_sent(tg, 1, MAIN_CHAT)
        trigger = tg.user_message(FIELD_CHAT, "@field anything new?")
        await until(lambda: (row := host.update(trigger["update_id"])) is not None and row["status"] == "done")
        menus = [c.params for c in tg.calls if c.method == "setMyCommands"]
    assert "start a message with @Field or mention @farm_test_bot" in (field_help.text or "")
    assert "/status" not in (field_help.text or "")
    assert status.text == "/status works only in the farm's main chat."
    assert listing.text == "/tasks works only in the farm's main chat."
    assert "every message is for me" in (main_help.text or "") and "/status - " in (main_help.text or "")
    # the commands were stored in the transcript, but they are not context for the agent
    [run] = prompts(root, "field")
    assert "/help" not in run["prompt"] and "/status" not in run["prompt"]
    assert [m["command"] for m in menus[0]["commands"]] == ["help"] and "scope" not in menus[0]
    assert [m["command"] for m in menus[1]["commands"]] == ["help", "status", "tasks", "stop", "resume"]
    assert menus[1]["scope"] == {"type": "chat", "chat_id": MAIN_CHAT}


async def test_a_failing_status_source_still_answers(root: Path, fake_telegram: FakeTelegram) -> None:
    async def broken() -> dict[str, Any]:
        raise RuntimeError("HA client exploded")

    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True, status=broken):
        tg.user_message(MAIN_CHAT, "/status")
        [status] = await wait_sent(tg, 1, MAIN_CHAT)
    assert (status.text or "").startswith("Farm status\nHome Assistant: unknown\nAgents: 0 running, 0 queued")
    assert "note: part of the status is unavailable (RuntimeError)" in (status.text or "")
