"""The farm simulator: a compressed farm day that drives the simulated farm's helpers in Home Assistant.

One farm hour lasts `tick` real seconds (10 by default, so a day takes 4 minutes). Every few seconds the
simulator reads HA's states and writes the `input_number.*_raw` helpers the farm's sensors follow:

- air temperature follows a day curve: warmest (17.5 °C) at 15:00, coldest (0.5 °C) at 03:00, so it is below
  2 °C from about 00:40 to 05:20 and `binary_sensor.frost_risk` (HA's template: raw temperature < 2) is on;
- air humidity follows the temperature the other way round (about 40 % in the afternoon, 90 % at night);
- the soil of each field dries a little every hour, faster when it is warm, and gets wetter while the irrigation
  pump (`input_boolean.pump_relay`) AND that field's valve relay are on and the pump has no fault.

The soil values are read back from HA before each step: whatever else set them (an agent, the HA UI, an HA
restart back to the `initial:` values) is where the simulation carries on from. The model functions are pure;
`FarmSimulator.step` is blocking (REST through DemoHa), run in a worker thread by `run`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

logger = logging.getLogger(__name__)

HOURS_PER_DAY: Final = 24.0
WARMEST_HOUR: Final = 15.0
MEAN_C: Final = 9.0
AMPLITUDE_C: Final = 8.5
FROST_C: Final = 2.0  # the farm's binary_sensor.frost_risk threshold (farmhost/localha/farm/configuration.yaml)
HUMIDITY_MEAN: Final = 65.0
HUMIDITY_SWING: Final = 25.0
DRY_BASE_PER_H: Final = 0.3  # % soil moisture lost per hour at 0 °C
DRY_PER_DEGREE_PER_H: Final = 0.05  # ... and this much more per degree above 0
WATERING_PER_H: Final = 12.0  # % gained per hour while the pump and the field's valve are on
SOIL_RANGE: Final = (5.0, 95.0)
SUMMARY_EVERY_HOURS: Final = 3  # a status line every 3 farm hours; events (frost, watering) when they happen
DEFAULT_TICK: Final = 10.0
DEFAULT_START_HOUR: Final = 18.0
# Someone else changed a helper when HA's value is further than this from what the simulator last wrote.
RESYNC_DELTA: Final = 0.15

TEMPERATURE: Final = "input_number.air_temperature_raw"
HUMIDITY: Final = "input_number.air_humidity_raw"
PUMP: Final = "input_boolean.pump_relay"
PUMP_FAULT: Final = "input_boolean.pump_fault_sim"


@dataclass(frozen=True)
class Field:
    """One field: its soil moisture helper and its valve relay."""

    name: str
    soil: str
    valve: str


FIELDS: Final = (
    Field("field 1", "input_number.field_1_soil_moisture_raw", "input_boolean.field_1_valve_relay"),
    Field("field 2", "input_number.field_2_soil_moisture_raw", "input_boolean.field_2_valve_relay"),
)


# ------------------------------------------------------------------------------------------------ the model


def air_temperature(hour: float) -> float:
    """°C at `hour` of the farm day (0-24, any real number wraps)."""
    return MEAN_C + AMPLITUDE_C * math.cos(2 * math.pi * (hour - WARMEST_HOUR) / HOURS_PER_DAY)


def air_humidity(temperature: float) -> float:
    """Relative humidity (%) at that temperature: high in the cold night, low in the warm afternoon."""
    return max(20.0, min(99.0, HUMIDITY_MEAN - HUMIDITY_SWING * (temperature - MEAN_C) / AMPLITUDE_C))


def soil_change(temperature: float, hours: float, *, watering: bool) -> float:
    """How much a field's soil moisture (%) changes in `hours`: drying, plus the irrigation while it runs."""
    drying = (DRY_BASE_PER_H + DRY_PER_DEGREE_PER_H * max(temperature, 0.0)) * hours
    return (WATERING_PER_H * hours if watering else 0.0) - drying


def clock_text(hour: float) -> str:
    """`HH:MM` of a farm hour."""
    minutes = round(hour * 60) % (24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


# ------------------------------------------------------------------------------------------------ the driver


class FarmHa(Protocol):
    """What the simulator needs of Home Assistant (DemoHa)."""

    def get_states(self) -> list[dict[str, Any]]:
        """Every state."""
        ...

    def set_number(self, entity_id: str, value: float) -> None:
        """input_number.set_value."""
        ...


@dataclass
class _Status:
    frost: bool | None = None
    watering: dict[str, bool] = field(default_factory=dict)
    next_summary: int | None = None
    failing: bool = False


class FarmSimulator:
    """Drives the farm's helpers in HA along the compressed day; `run()` until cancelled."""

    def __init__(
        self,
        ha: FarmHa,
        *,
        tick: float = DEFAULT_TICK,
        start_hour: float = DEFAULT_START_HOUR,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Set up the clock (it starts at the first step).

        Args:
            ha: the farm's Home Assistant.
            tick: real seconds per farm hour.
            start_hour: the farm's time of day at the first step.
            say: where the status and event lines go.
            clock: monotonic seconds (tests pass a fake one).
        """
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.ha = ha
        self.tick = tick
        self.start_hour = start_hour
        self._say = say
        self._clock = clock
        self._started: float | None = None
        self._last_hour: float | None = None
        self._soil: dict[str, float] = {}
        self._written: dict[str, float] = {}
        self._status = _Status()
        self.steps = 0

    @property
    def interval(self) -> float:
        """Real seconds between steps: a quarter of a farm hour, between 0.5 and 3 s."""
        return max(0.5, min(3.0, self.tick / 4))

    def hour(self) -> float:
        """The farm's hour now (grows past 24: day 2 starts at 24)."""
        if self._started is None:
            return self.start_hour
        return self.start_hour + (self._clock() - self._started) / self.tick

    async def run(self) -> None:
        """Step forever (cancel to stop); a failing HA is reported once and retried."""
        while True:
            try:
                await asyncio.to_thread(self.step)
                if self._status.failing:
                    self._status.failing = False
                    self._say("Home Assistant answers again; the farm simulation goes on")
            except (OSError, RuntimeError, ValueError, KeyError) as err:
                if not self._status.failing:
                    self._status.failing = True
                    self._say(f"Home Assistant did not answer the simulator ({err}); retrying")
            await asyncio.sleep(self.interval)

    def step(self) -> None:
        """Read HA, advance the farm to now, write what changed (blocking)."""
        if self._started is None:
            self._started = self._clock()
        hour = self.hour()
        hours = 0.0 if self._last_hour is None else max(0.0, hour - self._last_hour)
        self._last_hour = hour
        states = {str(s["entity_id"]): str(s["state"]) for s in self.ha.get_states()}
        temperature = air_temperature(hour)
        pump = states.get(PUMP) == "on" and states.get(PUMP_FAULT) != "on"
        watering = {f.name: pump and states.get(f.valve) == "on" for f in FIELDS}
        for f in FIELDS:
            soil = self._soil_now(f, states)
            soil += soil_change(temperature, hours, watering=watering[f.name])
            soil = min(SOIL_RANGE[1], max(SOIL_RANGE[0], soil))
            self._soil[f.name] = soil
            self._write(f.soil, round(soil, 1), states)
        self._write(TEMPERATURE, round(temperature, 1), states)
        self._write(HUMIDITY, float(round(air_humidity(temperature))), states)
        self.steps += 1
        self._report(hour, temperature, watering)

    def _soil_now(self, f: Field, states: dict[str, str]) -> float:
        """The simulator's exact value, unless HA's differs from what it last wrote (then HA's)."""
        try:
            in_ha = float(states[f.soil])
        except (KeyError, ValueError):
            return self._soil.get(f.name, 40.0)
        last = self._written.get(f.soil)
        if f.name not in self._soil or last is None or abs(in_ha - last) > RESYNC_DELTA:
            return in_ha
        return self._soil[f.name]

    def _write(self, entity_id: str, value: float, states: dict[str, str]) -> None:
        try:
            current: float | None = float(states[entity_id])
        except (KeyError, ValueError):
            current = None
        if current is None or abs(current - value) >= 0.05:
            self.ha.set_number(entity_id, value)
        self._written[entity_id] = value

    def _report(self, hour: float, temperature: float, watering: dict[str, bool]) -> None:
        status = self._status
        at = clock_text(hour)
        frost = temperature < FROST_C
        if status.frost is not None and frost != status.frost:
            self._say(
                f"{at} frost: the air is {temperature:.1f} °C, binary_sensor.frost_risk turns on"
                if frost
                else f"{at} the frost is over: {temperature:.1f} °C"
            )
        status.frost = frost
        for name, on in watering.items():
            if status.watering.get(name, False) != on:
                self._say(f"{at} {name} is being watered" if on else f"{at} {name} is no longer watered")
            status.watering[name] = on
        slot = int(hour // SUMMARY_EVERY_HOURS)
        if status.next_summary is None or slot >= status.next_summary:
            status.next_summary = slot + 1
            soils = ", ".join(f"{f.name} soil {self._soil[f.name]:.1f} %" for f in FIELDS)
            self._say(f"{at} air {temperature:.1f} °C, humidity {air_humidity(temperature):.0f} %, {soils}")
