"""Only members of the main chat decide there, when it is a public supergroup and no sender list is set.

The real daemon, the real Home Assistant test instance and the fake Bot API. The main chat is a supergroup
(anyone may open a public one and press its buttons) and FARMHOST_TELEGRAM_MAIN_SENDERS is not set: farmhost
asks Telegram (getChatMember) who is a member. A non-member's press on Approve, Acknowledge or Stop everything,
and their /stop or /resume, changes nothing (Home Assistant's states, the approval, the pause, the alert stay as
they were) and is answered with the reason; a member's works. (When Telegram cannot say, a press from the main
chat counts as a member's, as before the check: tests/telegram/test_main_members.py.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import ask_approval, audit, db_rows, farm_daemon, press_answer, wait_state, wait_told
from farmhost_testing import FIELD_JID, Daemon, register_in_process, scaled, wait_for
from ha_fixture import HaInstance
from telegram_stub import Call, FakeTelegram

from farmhost.telegram.inbound.main_members import NOT_A_MEMBER

pytestmark = pytest.mark.slow  # end to end, seconds each

MAIN_CHAT = -1001234567890
MAIN_JID = f"telegram:{MAIN_CHAT}"
PUMP = "switch.irrigation_pump"
AIR = "sensor.air_temperature"
ANA, EVE = 42, 66  # Ana is in the main chat; Eve only found it (a public supergroup) and presses its buttons
STOP_BUTTON = {"inline_keyboard": [[{"text": "Stop everything", "callback_data": "stop:all"}]]}


@pytest.fixture
def supergroup_dir(tmp_path: Path, fake_telegram: FakeTelegram) -> Path:
    """A data dir whose main chat is the supergroup, with the field group; Ana is a member of the supergroup."""
    root = tmp_path / "data"
    register_in_process(root, jid=MAIN_JID, name="Farm office", folder="main", is_main=True)
    register_in_process(root, jid=FIELD_JID, name="Field crew", folder="field")
    policy = {"actionGroups": {"ha_set_entity": ["main", "field"]}, "rules": [
        {"entities": [PUMP], "requireApproval": True},
    ]}  # fmt: skip
    (root / "farm-profile.json").write_text(json.dumps({"policy": policy}))
    fake_telegram.set_member(MAIN_CHAT, ANA, "member", first_name="Ana", username="ana")
    return root


def _told(tg: FakeTelegram, needle: str, *, count: int = 1) -> list[Call]:
    return wait_told(tg, MAIN_CHAT, needle, count=count)


@contextmanager
def _farm(data_dir: Path, ha_env: dict[str, str], tg: FakeTelegram, ha: HaInstance, pump: str) -> Iterator[Daemon]:
    """The daemon on the supergroup data dir, the pump `pump` ("on"/"off") in Home Assistant first."""
    ha.set_state(PUMP, pump == "on")
    wait_state(ha, PUMP, pump)
    with farm_daemon(data_dir, ha_env, tg) as daemon:
        yield daemon


def _press(tg: FakeTelegram, message: Call, data: str, user_id: int) -> str:
    name = {ANA: "ana", EVE: "eve"}[user_id]
    return press_answer(tg, tg.callback_query(MAIN_CHAT, message.result["message_id"], data, user_id=user_id,
                                              username=name))  # fmt: skip


def _write(tg: FakeTelegram, text: str, user_id: int) -> None:
    name = {ANA: "ana", EVE: "eve"}[user_id]
    tg.user_message(MAIN_CHAT, text, user_id=user_id, username=name, chat_type="supergroup")


def _asked_about(tg: FakeTelegram) -> list[int]:
    """Whom farmhost asked getChatMember about (every call, failed or not)."""
    return [c.params["user_id"] for c in tg.calls if c.method == "getChatMember"]


def _approval(data_dir: Path, approval_id: str) -> dict[str, Any]:
    (row,) = db_rows(data_dir, "SELECT * FROM approvals WHERE id = ?", approval_id)
    return row


def _paused(data_dir: Path) -> str | None:
    rows = db_rows(data_dir, "SELECT value FROM host_state WHERE key = 'agents_paused'")
    return rows[0]["value"] if rows else None


def _until(what: str, test: Callable[[], Any]) -> Any:
    return wait_for(test, timeout=scaled(20), what=what)


def test_only_a_member_of_a_public_main_chat_decides_an_approval(
    supergroup_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    data_dir, tg = supergroup_dir, fake_telegram
    with _farm(data_dir, ha_env, tg, ha_reset, "off"):
        approval_id, asked = ask_approval(tg, data_dir, MAIN_CHAT, "r-pump", {"entityId": PUMP, "value": "on"})
        approve = next(b["callback_data"] for b in asked.params["reply_markup"]["inline_keyboard"][0])
        assert approve.endswith(":y")

        by_eve = [_press(tg, asked, approve, EVE) for _ in range(2)]  # a second press asks Telegram no more
        eve_state = (_approval(data_dir, approval_id)["status"], ha_reset.get_state(PUMP)["state"])
        by_ana = _press(tg, asked, approve, ANA)
        wait_state(ha_reset, PUMP, "on")
        done = _until("the approval done", lambda: r if (r := _approval(data_dir, approval_id))["status"] == "done"
                      else None)  # fmt: skip

    assert by_eve == [NOT_A_MEMBER, NOT_A_MEMBER] and eve_state == ("pending", "off")
    assert by_ana == "Approved: running it now." and done["decided_by"] == "@ana"
    assert _asked_about(tg) == [EVE, ANA]  # Eve's answer was kept
    refusals = [line for line in audit(data_dir, "r-pump") if line.get("decision") == "refused press"]
    assert [(line["decidedBy"], line["detail"]) for line in refusals] == [
        ("@eve", f"@eve: {NOT_A_MEMBER}"), ("@eve", f"@eve: {NOT_A_MEMBER}"),
    ]  # fmt: skip


def test_only_a_member_of_a_public_main_chat_stops_and_resumes(
    supergroup_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    data_dir, tg = supergroup_dir, fake_telegram
    with _farm(data_dir, ha_env, tg, ha_reset, "on"):
        _write(tg, "/stop", EVE)
        [eve_stop] = _told(tg, NOT_A_MEMBER)
        by_eve_button = _press(tg, eve_stop, "stop:all", EVE)  # the button as on any alert or report
        after_eve = (ha_reset.get_state(PUMP)["state"], _paused(data_dir), [t for t in tg.sent_texts(MAIN_CHAT)
                                                                             if "EMERGENCY STOP" in t])  # fmt: skip

        _write(tg, "/stop", ANA)
        [report] = _told(tg, "EMERGENCY STOP by @ana")
        wait_state(ha_reset, PUMP, "off")
        paused = _paused(data_dir)
        _write(tg, "/resume", EVE)
        _told(tg, NOT_A_MEMBER, count=2)
        still_paused = _paused(data_dir)
        _write(tg, "/resume", ANA)
        _until("agents resumed", lambda: _paused(data_dir) is None)

    assert "reply_markup" not in eve_stop.params  # no Stop everything button for someone who may not press it
    assert by_eve_button == NOT_A_MEMBER and after_eve == ("on", None, [])
    assert report.params["reply_markup"] == STOP_BUTTON
    assert paused is not None and paused.startswith("stopped by /stop (@ana, ") and still_paused == paused
    stops = [line for line in audit(data_dir) if line["action"] == "emergency_stop"]
    assert [(line["by"], line["via"]) for line in stops] == [("@ana", "/stop")]
    assert set(_asked_about(tg)) == {EVE, ANA} and len(_asked_about(tg)) == 2  # each asked about once


def test_only_a_member_of_a_public_main_chat_acknowledges_an_alert(
    supergroup_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    data_dir, tg = supergroup_dir, fake_telegram
    with farm_daemon(data_dir, ha_env, tg) as daemon:
        wait_for(lambda: "following Home Assistant" in daemon.log(), timeout=scaled(20), what="the live view")
        ha_reset.set_state(AIR, -0.5)
        first = _told(tg, f"({AIR})")[0]
        ack = first.params["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
        assert ack.endswith(":ack")
        by_eve = _press(tg, first, ack, EVE)
        (notice,) = db_rows(data_dir, "SELECT * FROM alert_notices WHERE entity_id = ? AND chat_jid = ?", AIR, MAIN_JID)
        by_ana = _press(tg, first, ack, ANA)
        (acked,) = db_rows(data_dir, "SELECT * FROM alert_notices WHERE entity_id = ? AND chat_jid = ?", AIR, MAIN_JID)
        ha_reset.set_state(AIR, 12.0)

    assert by_eve == NOT_A_MEMBER and notice["acked_by"] is None
    assert by_ana == "Acknowledged: no more reminders of this alert." and acked["acked_by"] == "@ana"
