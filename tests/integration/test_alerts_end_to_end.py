"""Issue 34, item 1: farm alerts reach the chats by themselves, with no LLM.

The real daemon, the real Home Assistant (the farm's helpers driven as a person would) and the fake Bot API.
The repeat interval and the flap window are shortened by their settings so that a test waits seconds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import db_rows, farm_daemon
from farmhost_testing import MAIN_JID, Daemon, scaled, wait_for
from ha_fixture import HaInstance
from telegram_stub import Call, FakeTelegram

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
FIELD_CHAT = 200
AIR = "sensor.air_temperature"
FROST_RISK = "binary_sensor.frost_risk"
SOIL = "sensor.field_1_soil_moisture"
# 3 s between reminders and a 3 s flap window: the test sees four messages and a resolution within ~15 s.
FAST = {"FARMHOST_ALERT_REPEAT_MINUTES": "0.05", "FARMHOST_ALERT_FLAP_MINUTES": "0.05"}


def _following(daemon: Daemon) -> None:
    wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=scaled(20), what="the live view")


def _about(tg: FakeTelegram, chat: int, entity_id: str) -> list[Call]:
    """The messages sent to `chat` that name the entity (its alert, reminders and resolution line)."""
    return [call for call in tg.sent(chat) if f"({entity_id})" in (call.text or "")]


def _wait_about(tg: FakeTelegram, chat: int, entity_id: str, count: int, timeout: float = 20) -> list[Call]:
    found: list[Call] = wait_for(
        lambda: m if len(m := _about(tg, chat, entity_id)) >= count else None,
        timeout=scaled(timeout),
        what=f"{count} message(s) about {entity_id} in chat {chat}",
        seen=lambda: tg.sent_texts(chat)[-6:],
    )
    return found


def _notice(data_dir: Path, entity_id: str, jid: str = MAIN_JID) -> dict[str, Any]:
    rows = db_rows(
        data_dir, "SELECT * FROM alert_notices WHERE entity_id = ? AND chat_jid = ? ORDER BY id", entity_id, jid
    )
    assert len(rows) == 1, rows
    return rows[0]


def _wait_notice(data_dir: Path, entity_id: str, what: str, test: Any, jid: str = MAIN_JID) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: row if (rows := _rows(data_dir, entity_id, jid)) and test(row := rows[-1]) else None,
        timeout=scaled(20),
        what=f"the notice of {entity_id} {what}",
        seen=lambda: _rows(data_dir, entity_id, jid),
    )
    return found


def _rows(data_dir: Path, entity_id: str, jid: str) -> list[dict[str, Any]]:
    return db_rows(
        data_dir, "SELECT * FROM alert_notices WHERE entity_id = ? AND chat_jid = ? ORDER BY id", entity_id, jid
    )


def _buttons(call: Call) -> list[str]:
    markup = call.params.get("reply_markup") or {}
    return [button["callback_data"] for row in markup.get("inline_keyboard", []) for button in row]


def _alert_outbox(data_dir: Path, entity_id: str) -> list[dict[str, Any]]:
    """The outbox entries of the entity's alert messages to the main chat."""
    (row,) = _rows(data_dir, entity_id, MAIN_JID)
    return db_rows(data_dir, "SELECT * FROM outbox WHERE message_key LIKE ?", f"alert:{row['id']}:%")


def test_frost_is_told_once_repeated_until_acknowledged_and_resolved_with_one_reply(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # The field group subscribes its chat to frost alerts only (the operator's file, not the agent's).
    (data_dir / "alert-subscriptions.json").write_text(json.dumps({"groups": {"field": ["frost"]}}))
    with farm_daemon(data_dir, ha_env, fake_telegram, **FAST) as daemon:
        _following(daemon)
        ha_reset.set_state(AIR, -0.5)

        (first,) = _wait_about(fake_telegram, MAIN_CHAT, AIR, 1)[:1]
        assert (first.text or "").startswith("CRITICAL: Frost risk: Air temperature is -0.5 °C, below 2 °C. Since ")
        data = _buttons(first)
        assert data[0].endswith(":ack") and data[1].endswith(":snooze") and data[2] == "stop:all", data
        (in_field,) = _wait_about(fake_telegram, FIELD_CHAT, AIR, 1)[:1]  # the subscribed group's chat is told too
        # The main chat's button data pressed in another chat does nothing.
        fake_telegram.callback_query(FIELD_CHAT, in_field.result["message_id"], data[0])
        (refused,) = fake_telegram.wait_calls("answerCallbackQuery", 1)
        assert refused.params["text"] == "This alert is not from this chat."
        assert _notice(data_dir, AIR)["acked_by"] is None

        # Not acknowledged: told again after the repeat interval, as a reply to the first message.
        reminder = _wait_about(fake_telegram, MAIN_CHAT, AIR, 2)[1]
        assert (reminder.text or "").startswith("Reminder (1 of 3), CRITICAL: Frost risk"), reminder.text
        assert reminder.params["reply_parameters"]["message_id"] == first.result["message_id"]

        fake_telegram.callback_query(MAIN_CHAT, first.result["message_id"], data[0], user_id=MAIN_CHAT)  # its member
        acked = _wait_notice(data_dir, AIR, "acknowledged", lambda row: row["acked_by"] is not None)
        assert acked["acked_by"] == "@ana"

        # The frost-risk binary sensor's alert, not acknowledged, runs out its three reminders meanwhile:
        # four messages and then none (its next step is cleared).
        _wait_notice(data_dir, FROST_RISK, "out of reminders", lambda row: row["sends"] == 4 and row["due_at"] is None)
        assert len(_wait_about(fake_telegram, MAIN_CHAT, FROST_RISK, 4)) == 4  # delivered, and no fifth
        assert _notice(data_dir, AIR)["sends"] == acked["sends"]  # no reminder after the Acknowledge
        assert len(_wait_about(fake_telegram, MAIN_CHAT, AIR, acked["sends"])) == acked["sends"]

        ha_reset.set_state(AIR, 12.0)
        _wait_notice(data_dir, AIR, "closed", lambda row: row["status"] == "closed")
        told = _wait_about(fake_telegram, MAIN_CHAT, AIR, acked["sends"] + 1)
        (line,) = [c for c in told if (c.text or "").startswith("Resolved at ")]
        assert "Frost risk (sensor.air_temperature) is over. Acknowledged by" in (line.text or "")
        assert line.params["reply_parameters"]["message_id"] == first.result["message_id"]
        _wait_notice(data_dir, FROST_RISK, "closed", lambda row: row["status"] == "closed")
        _wait_about(fake_telegram, MAIN_CHAT, FROST_RISK, 5)  # four and its one resolution line
        assert not _about(fake_telegram, FIELD_CHAT, SOIL)
        assert len(_alert_outbox(data_dir, AIR)) == acked["sends"] + 1
        assert len(_about(fake_telegram, MAIN_CHAT, AIR)) == acked["sends"] + 1


def test_a_flapping_soil_sensor_gives_one_alert(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:  # the flap window is its default 10 min
        _following(daemon)
        for _ in range(3):
            ha_reset.set_state(SOIL, 24.0)
            _wait_notice(data_dir, SOIL, "open", lambda row: row["status"] == "open")
            ha_reset.set_state(SOIL, 26.0)
            _wait_notice(data_dir, SOIL, "resolving", lambda row: row["status"] == "resolving")
        (told,) = _wait_about(fake_telegram, MAIN_CHAT, SOIL, 1)
        assert (told.text or "").startswith("Warning: Soil moisture low: Field 1 soil moisture is 24 %")
        assert len(_alert_outbox(data_dir, SOIL)) == 1
        assert _about(fake_telegram, MAIN_CHAT, SOIL) == [told]


def test_quiet_hours_hold_a_warning_but_not_a_critical_alert(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    hour = datetime.now(UTC).hour
    quiet = f"{hour}-{(hour + 2) % 24}"  # now is inside, for at least an hour
    with farm_daemon(data_dir, ha_env, fake_telegram, TZ="UTC", FARMHOST_QUIET_HOURS=quiet) as daemon:
        _following(daemon)
        ha_reset.set_state(SOIL, 20.0)
        held = _wait_notice(data_dir, SOIL, "held", lambda row: row["status"] == "held" and row["due_at"])
        assert datetime.fromisoformat(held["due_at"]).hour == (hour + 2) % 24
        ha_reset.set_state(AIR, -1.0)
        _wait_about(fake_telegram, MAIN_CHAT, AIR, 1)  # critical never waits
        assert _notice(data_dir, SOIL)["status"] == "held"
        assert not _about(fake_telegram, MAIN_CHAT, SOIL)


def test_an_alert_is_told_exactly_once_across_a_kill_9(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    with farm_daemon(data_dir, ha_env, fake_telegram) as daemon:
        _following(daemon)
        # Killed while the alert waits in the outbox (Telegram answers 500): it goes once after the restart.
        fake_telegram.fail("sendMessage", status=500, times=1000, when=lambda p: "sensor.air_temperature" in str(p))
        ha_reset.set_state(AIR, 1.5)
        wait_for(lambda: _rows(data_dir, AIR, MAIN_JID) and _alert_outbox(data_dir, AIR), timeout=scaled(20),
                 what="the frost alert in the outbox")  # fmt: skip
        daemon.kill()
        fake_telegram.clear_failures()
        daemon.start(timeout=30)
        _following(daemon)
        _wait_about(fake_telegram, MAIN_CHAT, AIR, 1)
        _wait_sent(data_dir, AIR)
        # Killed again once it was told: the restarted daemon judges the farm again (a later alert is told) and
        # tells the frost no second time.
        daemon.kill()
        daemon.start(timeout=30)
        _following(daemon)
        ha_reset.set_state(SOIL, 20.0)
        _wait_about(fake_telegram, MAIN_CHAT, SOIL, 1)
        assert len(_about(fake_telegram, MAIN_CHAT, AIR)) == 1
        assert len(_alert_outbox(data_dir, AIR)) == 1
        assert len(_rows(data_dir, AIR, MAIN_JID)) == 1


def _wait_sent(data_dir: Path, entity_id: str) -> dict[str, Any]:
    """The entity's alert entry once the outbox recorded it sent (Telegram's answer and the commit are apart)."""
    found: dict[str, Any] = wait_for(
        lambda: e if (e := _alert_outbox(data_dir, entity_id)) and e[0]["status"] == "sent" else None,
        timeout=scaled(20),
        what=f"the alert of {entity_id} recorded sent",
        seen=lambda: _alert_outbox(data_dir, entity_id),
    )
    return found[0]


def test_an_alert_raised_while_telegram_is_unreachable_arrives_when_it_is_back_and_can_be_snoozed(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    # The outbox's retries 0.2, 0.4, 0.8 s apart instead of 2, 4, 8 s (FARMHOST_OUTBOX_RETRY_SECONDS).
    retry = {"FARMHOST_OUTBOX_RETRY_SECONDS": "0.2"}
    with farm_daemon(data_dir, ha_env, fake_telegram, FARMHOST_TELEGRAM_MAIN_SENDERS="42", **retry) as daemon:
        _following(daemon)
        fake_telegram.fail("sendMessage", drop_connection=True, times=3)
        ha_reset.set_state(AIR, 1.5)
        (told,) = _wait_about(fake_telegram, MAIN_CHAT, AIR, 1, timeout=60)
        assert (told.text or "").startswith("Warning: Frost risk: Air temperature is 1.5 °C")
        failed = [c for c in fake_telegram.calls if c.method == "sendMessage" and not c.ok]
        assert len(failed) >= 3
        entry = _wait_sent(data_dir, AIR)
        assert len(_alert_outbox(data_dir, AIR)) == 1 and entry["attempts"] <= 3

        # Someone the main chat does not hear cannot answer it; Snooze 1 h by Ana tells it again in an hour.
        snooze = _buttons(told)[1]
        fake_telegram.callback_query(MAIN_CHAT, told.result["message_id"], snooze, user_id=43, username="eve")
        (refused,) = fake_telegram.wait_calls("answerCallbackQuery", 1)
        assert refused.params["text"] == "Only members of the farm's main chat can decide this."
        assert _notice(data_dir, AIR)["due_at"] is None
        pressed = datetime.now(UTC)
        fake_telegram.callback_query(MAIN_CHAT, told.result["message_id"], snooze)
        answered = fake_telegram.wait_calls("answerCallbackQuery", 2)[1]
        assert answered.params["text"] == "Snoozed: you will be reminded in 1 h if it is still active."
        due = datetime.fromisoformat(_notice(data_dir, AIR)["due_at"])
        assert 3500 < (due - pressed).total_seconds() < 3700
