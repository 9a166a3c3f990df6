"""The simulated farm as tests rely on it: its entities (device class, unit, driving helper), start values, aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class FarmEntity:
    """An entity the farm configuration must create, with what a test may rely on."""

    entity_id: str
    device_class: str | None = None
    unit: str | None = None
    driver: str | None = None  # the helper whose value the entity follows (set it to drive the entity)


FARM_ENTITIES: tuple[FarmEntity, ...] = (
    # helpers: the knobs tests turn
    FarmEntity("input_number.field_1_soil_moisture_raw", unit="%"),
    FarmEntity("input_number.field_2_soil_moisture_raw", unit="%"),
    FarmEntity("input_number.air_temperature_raw", unit="°C"),
    FarmEntity("input_number.air_humidity_raw", unit="%"),
    FarmEntity("input_number.irrigation_duration_raw", unit="min"),
    FarmEntity("input_boolean.pump_relay"),
    FarmEntity("input_boolean.field_1_valve_relay"),
    FarmEntity("input_boolean.field_2_valve_relay"),
    FarmEntity("input_boolean.pump_fault_sim"),
    FarmEntity("input_boolean.barn_light_relay"),
    FarmEntity("input_boolean.greenhouse_fan_relay"),
    FarmEntity("input_select.irrigation_mode"),
    FarmEntity("input_select.fertigation_program_raw"),
    FarmEntity("input_select.weather_condition_raw"),
    # the farm as an agent sees it
    FarmEntity("sensor.field_1_soil_moisture", "moisture", "%", "input_number.field_1_soil_moisture_raw"),
    FarmEntity("sensor.field_2_soil_moisture", "moisture", "%", "input_number.field_2_soil_moisture_raw"),
    FarmEntity("sensor.air_temperature", "temperature", "°C", "input_number.air_temperature_raw"),
    FarmEntity("sensor.air_humidity", "humidity", "%", "input_number.air_humidity_raw"),
    FarmEntity("binary_sensor.frost_risk", "cold", None, "input_number.air_temperature_raw"),
    FarmEntity("binary_sensor.pump_fault", "problem", None, "input_boolean.pump_fault_sim"),
    FarmEntity("switch.irrigation_pump", driver="input_boolean.pump_relay"),
    FarmEntity("switch.field_1_valve", driver="input_boolean.field_1_valve_relay"),
    FarmEntity("switch.field_2_valve", driver="input_boolean.field_2_valve_relay"),
    FarmEntity("light.barn_light", driver="input_boolean.barn_light_relay"),
    FarmEntity("fan.greenhouse_fan", driver="input_boolean.greenhouse_fan_relay"),
    FarmEntity("number.irrigation_duration", unit="min", driver="input_number.irrigation_duration_raw"),
    FarmEntity("select.fertigation_program", driver="input_select.fertigation_program_raw"),
    FarmEntity("weather.farm_weather", driver="input_select.weather_condition_raw"),
    FarmEntity("calendar.farm", driver=None),  # local_calendar, created through the config-flow API at start
)
FARM_ENTITY_IDS = tuple(e.entity_id for e in FARM_ENTITIES)

# The value of every helper right after start (the `initial:` of configuration.yaml); `reset()` restores them.
FARM_DEFAULTS: dict[str, float | str] = {
    "input_number.field_1_soil_moisture_raw": 45.0,
    "input_number.field_2_soil_moisture_raw": 38.0,
    "input_number.air_temperature_raw": 14.5,
    "input_number.air_humidity_raw": 65.0,
    "input_number.irrigation_duration_raw": 30.0,
    "input_boolean.pump_relay": "off",
    "input_boolean.field_1_valve_relay": "off",
    "input_boolean.field_2_valve_relay": "off",
    "input_boolean.pump_fault_sim": "off",
    "input_boolean.barn_light_relay": "off",
    "input_boolean.greenhouse_fan_relay": "off",
    "input_select.irrigation_mode": "auto",
    "input_select.fertigation_program_raw": "none",
    "input_select.weather_condition_raw": "partlycloudy",
}
# The simulator's helpers: the knobs behind the farm, not something a farmer talks about.
SIM_DOMAINS: frozenset[str] = frozenset({"input_number", "input_boolean", "input_select"})
# What a farmer says for an entity, beside its name (Assist matches names and aliases, e.g. "what is the {name}").
ASSIST_ALIASES: dict[str, tuple[str, ...]] = {
    "sensor.field_1_soil_moisture": ("soil moisture of field 1", "field 1 moisture"),
    "sensor.field_2_soil_moisture": ("soil moisture of field 2", "field 2 moisture"),
    "switch.irrigation_pump": ("pump", "water pump"),
}
CALENDAR_NAME: Final = "Farm"  # the local_calendar entry setup_farm creates; HA names its entity from it
CALENDAR_ENTITY: Final = "calendar.farm"

# Driven entity -> its helper (so tests can say set_number("sensor.air_temperature", 1.0)).
DRIVERS: dict[str, str] = {
    e.entity_id: e.driver
    for e in FARM_ENTITIES
    if e.driver is not None and e.entity_id.startswith(("sensor.", "binary_"))
}
