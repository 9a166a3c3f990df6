"""The Stop everything button's data and the answers to /stop and /resume (farmhost/outbox/stop_messages.py, pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from farmhost.emergency_stop import EntityOutcome, ResumeReport, StopReport, stop_reason
from farmhost.outbox import stop_messages as stop
from farmhost.telegram.inbound.routing import MAIN_ONLY_COMMANDS

AT = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)


def _off(n: int) -> EntityOutcome:
    return EntityOutcome(entity_id=f"switch.valve_{n}", name=f"Valve {n}", safe="off", before="on", after="off")


def test_the_button_is_one_exact_datum_inside_telegrams_64_bytes() -> None:
    keyboard = stop.stop_keyboard()
    assert keyboard == {"inline_keyboard": [[{"text": "Stop everything", "callback_data": "stop:all"}]]}
    assert stop.is_stop_callback("stop:all")
    for forged in (None, "", "stop", "stop:", "stop:ALL", "stop:all:x", " stop:all", "stop:all\n", "fa:stop:all"):
        assert not stop.is_stop_callback(forged), forged
    assert {"stop", "resume"} <= MAIN_ONLY_COMMANDS


def test_a_stop_with_nothing_to_switch_says_why_and_still_how_to_resume() -> None:
    reason = stop_reason("@ana", AT)
    assert reason == "stopped by /stop (@ana, 2026-12-05 08:00 UTC)"
    no_ha = StopReport(
        by="@ana", at=AT, pause_reason=reason, problem="Home Assistant is not configured (HA_URL / HA_TOKEN)"
    )
    assert stop.stop_text(no_ha).splitlines()[1:] == [
        "Nothing was switched: Home Assistant is not configured (HA_URL / HA_TOKEN).",
        "No agent runs until /resume (chat messages and scheduled tasks start none). /resume turns nothing back on.",
    ]
    nothing = StopReport(by="@ana", at=AT, pause_reason=reason)
    assert "The farm profile guards no device that Home Assistant knows: nothing was switched." in stop.stop_text(
        nothing
    )


@pytest.mark.parametrize("count", [1, 20, 21, 45])
def test_long_lists_are_cut_with_how_many_more(count: int) -> None:
    report = StopReport(by="@ana", at=AT, pause_reason="x", made_safe=[_off(n) for n in range(count)])
    line = stop.stop_text(report).splitlines()[1]
    assert line.startswith(f"Turned off / closed ({count}): Valve 0 (switch.valve_0)")
    assert line.count("(switch.valve_") == min(count, stop.NAMES_SHOWN)
    assert line.endswith(
        f" and {count - stop.NAMES_SHOWN} more." if count > stop.NAMES_SHOWN else f"valve_{count - 1})."
    )


def test_resume_says_what_it_lifted_and_that_nothing_is_turned_on() -> None:
    assert stop.resume_text(ResumeReport(by="@bea", was=None)) == "Agents were not paused; nothing changed."
    text = stop.resume_text(ResumeReport(by="@bea", was=stop_reason("@ana", AT)))
    assert text.startswith("Agents resumed by @bea (they were stopped by /stop (@ana, 2026-12-05 08:00 UTC)).")
    assert "Nothing was turned back on" in text
