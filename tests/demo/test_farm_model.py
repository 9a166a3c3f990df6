"""The demo simulator's farm day: the pure model functions (the demo tests drive the real thing in HA)."""

from __future__ import annotations

from farmhost.demo.simulator import (
    FROST_C,
    air_humidity,
    air_temperature,
    clock_text,
    soil_change,
)


def test_the_day_has_a_warm_afternoon_and_a_night_frost_of_a_few_hours() -> None:
    temperatures = {minute / 60: air_temperature(minute / 60) for minute in range(0, 24 * 60, 5)}
    assert max(temperatures, key=lambda h: temperatures[h]) == 15
    assert min(temperatures, key=lambda h: temperatures[h]) == 3
    frost = [hour for hour, t in temperatures.items() if t < FROST_C]
    assert 4 <= len(frost) * 5 / 60 <= 5.5  # hours below 2 °C
    assert min(frost) > 0.5 and max(frost) < 5.5  # after midnight, over by sunrise
    assert air_temperature(27.0) == air_temperature(3.0)  # day 2 repeats day 1
    assert air_humidity(air_temperature(3)) > 85
    assert air_humidity(air_temperature(15)) < 45


def test_soil_dries_faster_when_warm_and_the_irrigation_wets_it() -> None:
    assert soil_change(15.0, 1.0, watering=False) < soil_change(1.0, 1.0, watering=False) < 0
    assert soil_change(15.0, 1.0, watering=True) > 10
    assert soil_change(15.0, 0.0, watering=True) == 0


def test_clock_text_wraps_at_midnight() -> None:
    assert clock_text(18) == "18:00" and clock_text(24.5) == "00:30" and clock_text(0.25) == "00:15"
