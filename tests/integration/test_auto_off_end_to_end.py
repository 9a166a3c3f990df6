"""Automatic off (`maxOnSeconds`), end to end: the real daemon, the real Home Assistant, the fake Bot API.

farmhost turns an entity off once it has been on for its limit, however it was turned on, tells the main chat
and writes an audit line; a manual off in HA cancels it; after a kill -9 past the off time the entity is
turned off as soon as farmhost is back, and the message says why late.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import assert_off_in_time, audit, db_rows, farm_daemon, sent_with, wait_state
from farmhost_testing import MAIN_JID, drop, hold_for, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from telegram_stub import FakeTelegram

pytestmark = pytest.mark.slow  # seconds each, waiting for real off times

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
BARN = "light.barn_light"
# The limit when nothing has to happen inside the on-period: long enough that an off at the first look (a limit
# ignored) or at the next look (LOOK_SECONDS, 2 s) would come before it; how long it held is read from HA's history.
LIMIT = 3


def _profile(data_dir: Path, rules: list[dict[str, Any]]) -> None:
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": rules}}))


def _rows(data_dir: Path, entity_id: str) -> list[dict[str, Any]]:
    return db_rows(data_dir, "SELECT * FROM auto_off WHERE entity_id = ? ORDER BY on_since", entity_id)


def _wait_status(data_dir: Path, entity_id: str, status: str, timeout: float = 20.0) -> dict[str, Any]:
    row: dict[str, Any] = wait_for(
        lambda: next((r for r in _rows(data_dir, entity_id) if r["status"] == status), None),
        timeout=timeout,
        what=f"an auto_off row of {entity_id} in status {status}",
        seen=lambda: _rows(data_dir, entity_id),
    )
    return row


def test_an_agent_turned_pump_is_turned_off_after_max_on_seconds_and_the_chat_is_told(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    limit = LIMIT
    _profile(data_dir, [{"entities": [PUMP], "maxOnSeconds": limit}])
    since = datetime.now(UTC)
    with farm_daemon(data_dir, ha_env, fake_telegram):
        rid = "r-pump-on"
        params = {"entityId": PUMP, "value": "on"}
        drop(
            data_dir,
            "main",
            "actions",
            {"type": "farm_action", "action": "ha_set_entity", "requestId": rid, "params": params},
        )
        assert wait_result(data_dir, "main", rid, timeout=20)["status"] == "success"
        _wait_status(data_dir, PUMP, "done")
        wait_state(ha_reset, PUMP, "off")
        row = assert_off_in_time(ha_reset, data_dir, PUMP, since, limit)  # no need to have watched it on
        told = wait_for(
            lambda: sent_with(fake_telegram, MAIN_CHAT, "Irrigation pump"), timeout=scaled(15), what="the off notice"
        )

    assert row["outcome"] == "switch.turn_off"
    assert "turned off Irrigation pump (switch.irrigation_pump)" in told[0] and f"allows {limit} s" in told[0]
    assert "was not running" not in told[0]
    (notice,) = [c for c in fake_telegram.sent(MAIN_CHAT) if "Irrigation pump" in (c.text or "")]
    assert notice.params["reply_markup"] == {
        "inline_keyboard": [[{"text": "Stop everything", "callback_data": "stop:all"}]]
    }
    (line,) = [a for a in audit(data_dir) if a["action"] == "auto_off"]
    assert line["group"] == "farmhost" and line["status"] == "success"
    assert line["params"]["entity_id"] == PUMP and line["params"]["service"] == "switch.turn_off"


def test_a_manual_off_in_home_assistant_cancels_the_automatic_off(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    _profile(data_dir, [{"entities": ["light.barn_*"], "maxOnSeconds": 600}])
    with farm_daemon(data_dir, ha_env, fake_telegram):
        ha_reset.call_service("light", "turn_on", {"entity_id": BARN})  # by hand: not through farmhost
        armed = _wait_status(data_dir, BARN, "armed")
        ha_reset.call_service("light", "turn_off", {"entity_id": BARN})
        cancelled = _wait_status(data_dir, BARN, "cancelled")
        ha_reset.call_service("light", "turn_on", {"entity_id": BARN})  # a new on-period is timed anew
        wait_for(lambda: len(_rows(data_dir, BARN)) == 2, timeout=scaled(20), what="a second on-period armed")

    assert cancelled["on_since"] == armed["on_since"]
    assert cancelled["outcome"] == "it was turned off before its time"
    assert [r["status"] for r in _rows(data_dir, BARN)] == ["cancelled", "armed"]
    assert not sent_with(fake_telegram, MAIN_CHAT, "Barn light")
    assert not [a for a in audit(data_dir) if a["action"] == "auto_off"]


def test_after_a_kill_9_past_the_off_time_it_is_turned_off_at_restart_and_the_chat_is_told_why_late(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    probe = {"entities": [BARN], "maxOnSeconds": 600}
    _profile(data_dir, [probe])
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        # The on-period must outlast what the test does inside it (the daemon sees it on and arms it, the test sees
        # the row and kills the daemon): that latency, measured on the barn light now, sizes it.
        started = time.monotonic()
        ha_reset.call_service("light", "turn_on", {"entity_id": BARN})
        _wait_status(data_dir, BARN, "armed")
        limit = math.ceil(hold_for(time.monotonic() - started, least=2))
        ha_reset.call_service("light", "turn_off", {"entity_id": BARN})
        _profile(data_dir, [probe, {"entities": [PUMP], "maxOnSeconds": limit}])  # read at the next look
        ha_reset.call_service("switch", "turn_on", {"entity_id": PUMP})
        armed = _wait_status(data_dir, PUMP, "armed")
        daemon.kill()
        assert _rows(data_dir, PUMP)[0]["status"] == "armed", "the daemon turned it off before the kill"
        off_at = datetime.fromisoformat(armed["off_at"])
        wait_for(lambda: datetime.now(UTC) > off_at, timeout=limit + 5, interval=0.1, what="the off time to pass")
        assert ha_reset.get_state(PUMP)["state"] == "on"  # nobody turned it off while farmhost was down
        daemon.start(timeout=30)
        wait_state(ha_reset, PUMP, "off")
        done = _wait_status(data_dir, PUMP, "done")
        told = wait_for(
            lambda: sent_with(fake_telegram, MAIN_CHAT, "was not running"), timeout=scaled(15), what="the late notice"
        )

    assert done["on_since"] == armed["on_since"] and done["outcome"] == "switch.turn_off (late)"
    assert "Irrigation pump (switch.irrigation_pump)" in told[0] and "now that it is back" in told[0]
    assert len(sent_with(fake_telegram, MAIN_CHAT, "Irrigation pump")) == 1  # told once
