"""The pure parts of farm/state/alert_notifier.py: quiet hours, the buttons' data, the subscriptions file, the setting."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from farmhost.config import Settings
from farmhost.farm.state.alert_notifier import QuietHours, keyboard, parse_callback, read_subscriptions

LISBON = ZoneInfo("Europe/Lisbon")


@pytest.mark.parametrize(
    ("quiet", "local", "end"),
    [
        ("22-06", "2026-12-05T23:30", "2026-12-06T06:00"),
        ("22-06", "2026-12-05T03:10", "2026-12-05T06:00"),
        ("22-06", "2026-12-05T06:00", None),
        ("22-06", "2026-12-05T21:59", None),
        ("01-05", "2026-12-05T01:00", "2026-12-05T05:00"),
        ("01-05", "2026-12-05T05:00", None),
        ("07-07", "2026-12-05T07:30", None),  # start == end: never quiet
    ],
)
def test_quiet_hours_end_in_the_farms_zone(quiet: str, local: str, end: str | None) -> None:
    now = datetime.fromisoformat(local).replace(tzinfo=LISBON).astimezone(UTC)
    found = QuietHours.parse(quiet).end_after(now, LISBON)
    assert (found.astimezone(LISBON).replace(tzinfo=None).isoformat(timespec="minutes") if found else None) == end


@pytest.mark.parametrize("bad", ["22", "22-24", "x-06", "22-06-01", "-1-06", ""])
def test_quiet_hours_that_are_not_hh_hh_are_refused_with_a_sentence(bad: str) -> None:
    with pytest.raises(ValueError, match="write two hours 0-23 as HH-HH"):
        QuietHours.parse(bad)


def test_the_setting_is_checked_at_start() -> None:
    with pytest.raises(ValidationError, match="write two hours 0-23 of the farm's time zone as HH-HH"):
        Settings(FARMHOST_QUIET_HOURS="22-25")  # type: ignore[call-arg]
    assert Settings(FARMHOST_QUIET_HOURS=" 22-06 ").quiet_hours == "22-06"  # type: ignore[call-arg]
    assert Settings(FARMHOST_QUIET_HOURS="").quiet_hours is None  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        ("al:12:ack", (12, "ack")),
        ("al:1:snooze", (1, "snooze")),
        ("al:012:ack", None),
        ("al:12:ack:x", None),
        ("al:12:ACK", None),
        ("al:1234567890123:ack", None),
        ("al::ack", None),
        ("al:12:ack\n", None),
        (None, None),
    ],
)
def test_only_the_exact_button_data_is_an_alert_press(data: str | None, parsed: tuple[int, str] | None) -> None:
    assert parse_callback(data) == parsed


def test_critical_alerts_carry_stop_everything_as_a_second_row() -> None:
    rows = keyboard(7, critical=True)["inline_keyboard"]
    assert [[b["callback_data"] for b in row] for row in rows] == [["al:7:ack", "al:7:snooze"], ["stop:all"]]
    assert len(keyboard(7, critical=False)["inline_keyboard"]) == 1


def test_subscriptions_keep_valid_groups_and_drop_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "alert-subscriptions.json"
    assert read_subscriptions(path) == {}
    doc = {"groups": {"field": ["frost", "soil_moisture_low"], "barn": ["*"], "bad": ["hail"], "worse": "frost"}}
    path.write_text(json.dumps(doc))
    assert read_subscriptions(path) == {"field": frozenset({"frost", "soil_moisture_low"}), "barn": frozenset({"*"})}
    path.write_text("{not json")
    assert read_subscriptions(path) == {}
