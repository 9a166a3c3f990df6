"""Helpers of the end-to-end farm tests: the real daemon with HA and the fake Bot API, and what they leave behind."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from farmhost_testing import MAIN_JID, Daemon, clean_env, drop, refused, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from telegram_stub import Call, FakeTelegram

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))  # where approvals are asked
# The main chat (telegram:100) is a private chat with the bot: its one member, Ana (user 100), decides there.
PRESSER = MAIN_CHAT


@contextmanager
def farm_daemon(data_dir: Path, ha_env: dict[str, str], tg: FakeTelegram, **extra: str) -> Iterator[Daemon]:
    """`farmhost run` with Home Assistant and Telegram; afterwards no traceback in its log and a clean exit."""
    env = clean_env(
        **ha_env,
        TELEGRAM_BOT_TOKEN=tg.token,
        TELEGRAM_API_BASE_URL=tg.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        **extra,
    )
    daemon = Daemon(data_dir, env=env).start(timeout=30)
    try:
        yield daemon
        assert "Traceback" not in daemon.log()
    finally:
        if daemon.proc is not None:
            assert daemon.stop() == 0, daemon.log()[-3000:]


def db_rows(data_dir: Path, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of the daemon's database, read on a connection of our own."""
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute(sql, args).fetchall()]


def audit(data_dir: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    """The lines of farm-state/audit.ndjson (of one request)."""
    path = data_dir / "farm-state" / "audit.ndjson"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if request_id is None or line["requestId"] == request_id]


def wait_state(ha: HaInstance, entity_id: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
    """The entity's state document, once HA reports it in `state`."""
    found: dict[str, Any] = wait_for(
        lambda: s if (s := ha.get_state(entity_id))["state"] == state else None,
        timeout=timeout,
        interval=0.05,
        what=f"{entity_id} to be {state} in Home Assistant",
        seen=lambda: ha.get_state(entity_id)["state"],
    )
    return found


def ha_changes(ha: HaInstance, entity_id: str, since: datetime) -> list[tuple[str, datetime]]:
    """The entity's states in HA's recorder from `since` on, oldest first: (state, last_changed by HA's clock).

    The first is the state it was in at `since`. The recorder commits every second, so a change just made may be
    missing: wait for the one the test needs (`wait_changes`).
    """
    query = f"filter_entity_id={entity_id}&minimal_response&no_attributes"
    answer = ha.api("GET", f"/api/history/period/{quote(since.isoformat())}?{query}")
    return [(row["state"], datetime.fromisoformat(row["last_changed"])) for row in (answer[0] if answer else [])]


def on_period(ha: HaInstance, entity_id: str, since: datetime, on: str = "on") -> tuple[datetime, datetime]:
    """When the entity went `on` after `since` and when it next went to another state, as HA's recorder has them.

    Waits for the recorder to hold the end. A re-stamp in between (a template.reload, a restart) records `on`
    again with a later last_changed: the period runs from the first `on`.
    """

    def period() -> tuple[datetime, datetime] | None:
        changes = ha_changes(ha, entity_id, since)
        start = next((i for i, (state, at) in enumerate(changes) if state == on and at >= since), None)
        if start is None:
            return None
        end = next((at for state, at in changes[start:] if state not in (on, "unavailable", "unknown")), None)
        return (changes[start][1], end) if end is not None else None

    found: tuple[datetime, datetime] = wait_for(
        period,
        timeout=15,
        what=f"an on-period of {entity_id} in HA's history",
        seen=lambda: ha_changes(ha, entity_id, since),
    )
    return found


def assert_off_in_time(ha: HaInstance, data_dir: Path, entity_id: str, since: datetime, limit: int) -> dict[str, Any]:
    """The entity's one on-period since `since` was ended by the automatic off no sooner than `limit` allows.

    Read from what happened, not from how long the test watched: HA's history (when it went on and off) and the
    daemon's one auto_off row (when it saw it on, the off time it planned). Whatever the load, an off before its
    time fails here, as does a limit not kept to or an on-period timed twice. Returns the row.
    """
    on_at, off_at = on_period(ha, entity_id, since)
    rows = db_rows(data_dir, "SELECT * FROM auto_off WHERE entity_id = ?", entity_id)
    assert len(rows) == 1, f"one on-period timed once, not {rows}"
    row = rows[0]
    seen_on, planned = datetime.fromisoformat(row["on_since"]), datetime.fromisoformat(row["off_at"])
    assert row["status"] == "done" and row["max_on_seconds"] == limit, row
    assert planned - seen_on == timedelta(seconds=limit), row
    assert seen_on >= on_at - timedelta(milliseconds=1), (on_at, row)  # timed from when it went on, not before
    assert off_at >= planned and (off_at - on_at).total_seconds() >= limit, (on_at, off_at, row)
    return row


def sent_with(tg: FakeTelegram, chat_id: int, needle: str) -> list[str]:
    """The texts sent to `chat_id` that contain `needle`."""
    return [text for text in tg.sent_texts(chat_id) if needle in text]


def wait_told(tg: FakeTelegram, chat_id: int, needle: str, *, count: int = 1) -> list[Call]:
    """The messages sent to `chat_id` that contain `needle`, once there are at least `count` of them."""
    found: list[Call] = wait_for(
        lambda: m if len(m := [c for c in tg.sent(chat_id) if needle in (c.text or "")]) >= count else None,
        timeout=scaled(20),
        what=f"{count} message(s) with {needle!r} in chat {chat_id}",
        seen=lambda: tg.sent_texts(chat_id),
    )
    return found


def ask_approval(
    tg: FakeTelegram, data_dir: Path, main_chat: int, request_id: str, params: dict[str, Any], folder: str = "field"
) -> tuple[str, Call]:
    """Drop an `ha_set_entity` under approval as `folder`'s agent does; its approval id and the main chat's message."""
    action = {"type": "farm_action", "action": "ha_set_entity", "requestId": request_id, "params": params}
    drop(data_dir, folder, "actions", action)
    asking = wait_result(data_dir, folder, request_id, timeout=20)
    refused(asking, "pending_approval", "needs an approval")
    approval_id: str = asking["result"]["approvalId"]
    [asked] = wait_told(tg, main_chat, approval_id)
    return approval_id, asked


def wait_counted(data_dir: Path, entity_id: str, count: int) -> None:
    """`count` effects of the entity are counted (the live view counts one just after the call's answer)."""
    wait_for(
        lambda: len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", entity_id)) == count,
        timeout=10,
        what=f"{count} effect(s) of {entity_id} counted",
        seen=lambda: len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", entity_id)),
    )


def approval_asked(tg: FakeTelegram, approval_id: str) -> Call:
    """The message the main chat got for this approval."""
    found: Call = wait_for(
        lambda: next((c for c in tg.sent(MAIN_CHAT) if approval_id in (c.text or "")), None),
        timeout=15,
        what=f"the approval message of {approval_id} in the main chat",
        seen=lambda: tg.sent_texts(MAIN_CHAT),
    )
    return found


def press_approval(tg: FakeTelegram, asked: Call, choice: str, *, user_id: int = PRESSER, username: str = "ana") -> str:
    """Press Approve (`y`) or Deny (`n`) on the approval message; returns what the press was answered."""
    row, _stop = asked.params["reply_markup"]["inline_keyboard"]
    (button,) = [b for b in row if b["callback_data"].endswith(f":{choice}")]
    update = tg.callback_query(
        MAIN_CHAT, asked.result["message_id"], button["callback_data"], user_id=user_id, username=username
    )
    return press_answer(tg, update)


def press_answer(tg: FakeTelegram, update: dict[str, Any]) -> str:
    """What the daemon answered a button press (the callback query of `update`)."""
    query_id = update["callback_query"]["id"]
    answer: Call = wait_for(
        lambda: next(
            (
                c
                for c in tg.calls
                if c.method == "answerCallbackQuery" and str(c.params.get("callback_query_id")) == query_id
            ),
            None,
        ),
        timeout=15,
        what=f"the answer to the press {query_id}",
    )
    text: str = answer.params.get("text", "")
    return text
