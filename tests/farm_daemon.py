"""Helpers of the end-to-end farm tests: the real daemon with HA and the fake Bot API, and what they leave behind."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, clean_env, wait_for
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram


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


def sent_with(tg: FakeTelegram, chat_id: int, needle: str) -> list[str]:
    """The texts sent to `chat_id` that contain `needle`."""
    return [text for text in tg.sent_texts(chat_id) if needle in text]


def wait_counted(data_dir: Path, entity_id: str, count: int) -> None:
    """`count` effects of the entity are counted (the live view counts one just after the call's answer)."""
    wait_for(
        lambda: len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", entity_id)) == count,
        timeout=10,
        what=f"{count} effect(s) of {entity_id} counted",
        seen=lambda: len(db_rows(data_dir, "SELECT * FROM actuator_calls WHERE entity_id = ?", entity_id)),
    )
