"""The morning report, end to end: the real daemon, the real HA and its recorder, the fake Bot API, no LLM.

What happens first (a frost alert raised and resolved, the guarded pump run by hand) is then in the report the
main chat gets at start once FARMHOST_DAILY_REPORT's time has passed, exactly once across a restart.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import MAIN_JID, clean_env, running_daemon, wait_for
from ha_fixture import HaInstance
from llm_stub import Reply, ScriptedLLM, ToolCall
from telegram_stub import FakeTelegram

from farmhost.scheduler.daily_report import report_key
from farmhost.store.db import Database

pytestmark = pytest.mark.slow  # end to end, many seconds each (make test-fast leaves it out)

MAIN_CHAT = int(MAIN_JID.removeprefix("telegram:"))
PUMP = "switch.irrigation_pump"
ZONE = "Europe/Amsterdam"


def _alerts(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "farm-state" / "alerts.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"active": [], "resolved": []}
    return doc


def _pump_on_record(ha: HaInstance) -> tuple[int, int] | None:
    """(seconds on, times turned on) of the pump over the last day, from HA's REST history (the test's own count).

    None until the recorder holds the pump's last change (it commits every second).
    """
    answer = ha.api("GET", f"/api/history/period?filter_entity_id={PUMP}&minimal_response&no_attributes")
    rows = answer[0] if answer else []
    if not rows or rows[-1]["state"] != "off" or not any(r["state"] == "on" for r in rows):
        return None
    now = datetime.now(UTC)
    changes = [(datetime.fromisoformat(r["last_changed"]), r["state"]) for r in rows]
    on = sum(
        ((changes[i + 1][0] if i + 1 < len(changes) else now) - at).total_seconds()
        for i, (at, state) in enumerate(changes)
        if state == "on"
    )
    turned_on = sum(1 for (_, a), (_, b) in pairwise(changes) if a == "off" and b == "on")
    return round(on), turned_on


def test_the_morning_report_tells_what_happened_once_a_day(
    data_dir: Path, fake_telegram: FakeTelegram, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    (data_dir / "farm-profile.json").write_text(
        json.dumps({"policy": {"rules": [{"entities": [PUMP], "maxOnSeconds": 3600}]}})
    )
    env = clean_env(
        **ha_env,
        TZ=ZONE,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_STATE_POLL_SECONDS="0.5",
    )
    with running_daemon(data_dir, env=env):
        ha_reset.set_number("sensor.air_temperature", 1.0)
        wait_for(lambda: any(a["rule"] == "frost" for a in _alerts(data_dir)["active"]), what="the frost alert")
        ha_reset.set_number("sensor.air_temperature", 14.5)
        wait_for(lambda: any(a["rule"] == "frost" for a in _alerts(data_dir)["resolved"]), what="frost resolved")
        ha_reset.call_service("input_boolean", "turn_on", {"entity_id": "input_boolean.pump_relay"})
        wait_for(lambda: ha_reset.get_state(PUMP)["state"] == "on", what="the pump on")
        started = datetime.fromisoformat(ha_reset.get_state(PUMP)["last_changed"])
        wait_for(lambda: (datetime.now(UTC) - started).total_seconds() > 2, what="the pump to run a while")
        ha_reset.call_service("input_boolean", "turn_off", {"entity_id": "input_boolean.pump_relay"})
        wait_for(lambda: ha_reset.get_state(PUMP)["state"] == "off", what="the pump off")
    alerts = _alerts(data_dir)
    assert not alerts["active"] and {a["rule"] for a in alerts["resolved"]} == {"frost"}
    messages = [a["message"] for a in alerts["resolved"]]
    on_seconds, turned_on = wait_for(lambda: _pump_on_record(ha_reset), what="the recorder to hold the pump's run")

    reported = {**env, "FARMHOST_DAILY_REPORT": "00:00"}  # always passed today: due at start
    with running_daemon(data_dir, env=reported) as daemon:
        # the frost alert and its resolution were told to the main chat too: the report is the one that says so
        (report,) = wait_for(
            lambda: [c for c in fake_telegram.sent(MAIN_CHAT) if (c.text or "").startswith("Good morning")],
            timeout=30,
            what="the morning report",
        )
        assert "Traceback" not in daemon.log()
    text = str(report.params["text"])
    assert f"Alerts: {len(messages)} raised, {len(messages)} resolved, 0 active now." in text, text
    assert all(f"• raised: {m}" in text and f"• resolved: {m}" in text for m in messages), text
    seconds = f"{on_seconds} s" if on_seconds < 60 else f"{on_seconds // 60} min {on_seconds % 60:02d} s"
    assert f"• {PUMP}: {seconds} on, turned on {turned_on}×" in text, text
    assert "Tasks: 0 run." in text and "LLM use yesterday: none." in text

    with running_daemon(data_dir, env=reported) as daemon:  # the same day again: not a second report
        wait_for(lambda: "queued before, not again" in daemon.log(), what="the report to be skipped")
    assert len([c for c in fake_telegram.sent(MAIN_CHAT) if (c.text or "").startswith("Good morning")]) == 1
    db = Database.open(data_dir)
    try:
        query = "SELECT message_key, source_folder FROM outbox WHERE message_key LIKE 'daily-report:%'"
        keys = [tuple(r) for r in db.conn.execute(query)]
    finally:
        db.close()
    # the host's own message: ahead of an agent's backlog, outside the main group's share of the outbox
    assert keys == [(report_key(datetime.now(ZoneInfo(ZONE)).date().isoformat()), None)]


def test_an_agent_writes_the_report_from_the_facts_and_a_held_call_says_it_waits(
    data_dir: Path, fake_telegram: FakeTelegram, llm_stub: ScriptedLLM, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    (data_dir / "farm-profile.json").write_text(
        json.dumps({"policy": {"rules": [{"entities": [PUMP], "requireApproval": True}]}})
    )
    llm_stub.script(
        ToolCall("ha_set_entity", {"entityId": PUMP, "value": "on"}),
        Reply("I asked for the pump."),
        Reply("Good morning! One pump run waits for your approval."),  # the report, by the agent
    )
    env = clean_env(
        **ha_env,
        TZ=ZONE,
        TELEGRAM_BOT_TOKEN=fake_telegram.token,
        TELEGRAM_API_BASE_URL=fake_telegram.api_root,
        FARMHOST_TELEGRAM_POLL_TIMEOUT="1",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY="sk-e2e",
    )
    with running_daemon(data_dir, env=env):
        fake_telegram.user_message(MAIN_CHAT, "Turn the pump on", chat_type="private", title=None)
        wait_for(
            lambda: [c for c in fake_telegram.sent(MAIN_CHAT) if "I asked for the pump." in str(c.params["text"])],
            timeout=60,
            what="the run's reply",
        )
    (reply,) = [str(c.params["text"]) for c in fake_telegram.sent(MAIN_CHAT) if "I asked" in str(c.params["text"])]
    assert reply.splitlines()[-1] == "⏳ set Irrigation pump to on waits for approval"  # the receipt: nothing changed
    assert "✔" not in reply and ha_reset.get_state(PUMP)["state"] == "off"

    before = len(fake_telegram.sent(MAIN_CHAT))
    reported = {**env, "FARMHOST_DAILY_REPORT": "00:00", "FARMHOST_DAILY_REPORT_BY_AGENT": "true"}
    with running_daemon(data_dir, env=reported):
        report = fake_telegram.wait_sent(before + 1, chat_id=MAIN_CHAT, timeout=60)[-1]
    assert report.params["text"] == "Good morning! One pump run waits for your approval."
    prompt = llm_stub.requests[-1].text()  # the facts farmhost handed the run
    assert "Approvals: 1 pending." in prompt and "Tasks: 0 run." in prompt and "Alerts: none raised" in prompt
    assert f"• {PUMP}: " in prompt  # the guarded pump is reported
