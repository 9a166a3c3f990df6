"""`when` conditions (scheduler/when.py): what an agent may write, the sentence each mistake gets, what holds."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from farmhost.scheduler.specs import ScheduleError, ScheduleType, first_run, parse_schedule
from farmhost.scheduler.when import Condition, ConditionError, load_condition, parse_condition

SOIL = "sensor.field_1_soil_moisture"
ZONE = ZoneInfo("Europe/Lisbon")

# (schedule_value, the field the sentence names, another word it must contain)
INVALID: list[tuple[object, str, str]] = [
    ('{"entity": "sensor.x", "below": 25}', "JSON object, not a string", "{"),
    (25, "JSON object", "entity"),
    ([SOIL], "JSON object", "alert"),
    ({}, "schedule_value.entity", "required"),
    ({"below": 25}, "schedule_value.entity", "required"),
    ({"entity": SOIL}, "schedule_value.below", "required"),
    ({"entity": "Sensor.Field 1", "below": 25}, "schedule_value.entity", "entity id"),
    ({"entity": 7, "below": 25}, "schedule_value.entity", "entity id"),
    ({"entity": f"{SOIL}\n", "below": 25}, "schedule_value.entity", "entity id"),
    ({"entity": SOIL, "below": "25"}, "schedule_value.below", "number"),
    ({"entity": SOIL, "below": True}, "schedule_value.below", "number"),
    ({"entity": SOIL, "above": float("nan")}, "schedule_value.above", "number"),
    ({"entity": SOIL, "above": 30, "below": 20}, "schedule_value.below", "greater than schedule_value.above"),
    ({"entity": SOIL, "state": ""}, "schedule_value.state", "state string"),
    ({"entity": SOIL, "state": 1}, "schedule_value.state", "state string"),
    ({"entity": SOIL, "state": "on", "below": 3}, "schedule_value.below", "cannot be combined"),
    ({"entity": SOIL, "below": 25, "for": -1}, "schedule_value.for", "between 0"),
    ({"entity": SOIL, "below": 25, "for": "10m"}, "schedule_value.for", "seconds"),
    ({"entity": SOIL, "below": 25, "for": 8 * 86400}, "schedule_value.for", "between"),
    ({"entity": SOIL, "below": 25, "cooldown": 1}, "schedule_value.cooldown", "between 5"),
    ({"entity": SOIL, "below": 25, "cooldown": None}, "schedule_value.cooldown", "seconds"),
    ({"entity": SOIL, "below": 25, "every": 5}, "schedule_value.every", "not a condition field"),
    ({"alert": "hail"}, "schedule_value.alert", "frost"),
    ({"alert": "frost", "entity": SOIL}, "schedule_value.entity", "cannot be combined with schedule_value.alert"),
    ({"alert": "frost", "for": 60}, "schedule_value.for", "cannot be combined"),
]


@pytest.mark.parametrize(("value", "field", "word"), INVALID)
def test_an_invalid_condition_is_refused_naming_the_field(value: object, field: str, word: str) -> None:
    with pytest.raises(ConditionError) as caught:
        parse_condition(value)
    assert field in str(caught.value) and word in str(caught.value)
    with pytest.raises(ScheduleError, match="schedule_value"):  # the same sentence through schedule_task's parser
        parse_schedule("when", value, tz=ZONE)


@pytest.mark.parametrize("schedule_type", ["cron", "interval", "once"])
def test_an_object_is_refused_for_the_clock_schedules(schedule_type: str) -> None:
    with pytest.raises(ScheduleError, match=f"schedule_value of a {schedule_type} task must be a string or a number"):
        parse_schedule(schedule_type, {"entity": SOIL, "below": 25}, tz=ZONE)


def test_a_valid_condition_is_stored_canonically_with_its_default_cooldown() -> None:
    spec = parse_schedule("when", {"for": 600.0, "below": 25, "entity": SOIL}, tz=ZONE)
    assert spec.type is ScheduleType.WHEN
    assert spec.value == '{"below":25,"cooldown":3600,"entity":"sensor.field_1_soil_moisture","for":600}'
    assert load_condition(spec.value) == Condition(entity=SOIL, below=25.0, hold=600.0)
    assert first_run(spec, tz=ZONE, now=datetime.now(ZONE)) is None
    alert = parse_condition({"alert": "frost", "cooldown": 60})
    assert alert.canonical() == '{"alert":"frost","cooldown":60}' and alert.describe() == "a new frost alert"


@pytest.mark.parametrize(
    ("condition", "state", "holds"),
    [
        ({"below": 25}, "24.9", True),
        ({"below": 25}, "25", False),
        ({"below": 25}, "dry", False),
        ({"below": 25}, "unavailable", None),
        ({"below": 25}, "unknown", None),
        ({"above": 30}, "30.5", True),
        ({"above": 10, "below": 20}, "15", True),
        ({"above": 10, "below": 20}, "20", False),
        ({"state": "on"}, "on", True),
        ({"state": "on"}, "off", False),
        ({"state": "on"}, "unavailable", None),
    ],
)
def test_what_holds(condition: dict[str, object], state: str, holds: bool | None) -> None:
    assert parse_condition({"entity": SOIL, **condition}).holds(state) is holds
