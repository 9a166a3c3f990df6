"""Tests of the suite's own Home Assistant: running, token over REST and WebSocket, the farm, restart and stop/start."""

from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from farmhost_testing import scaled, wait_for
from ha_fixture import (
    CALENDAR_ENTITY,
    FARM_DEFAULTS,
    FARM_ENTITIES,
    HA_VERSION,
    FarmEntity,
    HaHttpError,
    HaInstance,
    WsSession,
)

from farmhost.localha import supervisor
from farmhost.localha.client import http_json
from farmhost.localha.install import installed_version


def _state(ha: HaInstance, entity_id: str) -> str:
    state: str = ha.get_state(entity_id)["state"]
    return state


def _follows(ha: HaInstance, entity_id: str, expected: str) -> bool:
    return _state(ha, entity_id) == expected


def test_instance_is_running_the_pinned_release(ha_reset: HaInstance) -> None:
    config = ha_reset.api("GET", "/api/config")
    assert config["state"] == "RUNNING"
    assert config["version"] == HA_VERSION
    assert config["time_zone"] == "Europe/Amsterdam"
    assert config["unit_system"]["temperature"] == "°C"
    # minimal configuration: none of default_config's integrations but the recorder and its history (ha_history)
    assert not {"cloud", "zeroconf", "bluetooth", "mobile_app"} & set(config["components"])
    assert {"template", "input_number", "lovelace", "local_calendar", "fan", "recorder", "history"} <= set(
        config["components"]
    )


def test_the_token_works_over_rest_and_a_wrong_one_is_refused(ha_reset: HaInstance) -> None:
    assert ha_reset.api("GET", "/api/") == {"message": "API running."}
    with pytest.raises(HaHttpError) as refused:
        http_json("GET", ha_reset.url + "/api/states", "not-" + ha_reset.token)
    assert refused.value.status == 401
    with pytest.raises(HaHttpError) as anonymous:
        http_json("GET", ha_reset.url + "/api/states", None)
    assert anonymous.value.status == 401


def test_the_token_works_over_websocket(ha_reset: HaInstance) -> None:
    with ha_reset.ws() as ws:
        assert ws.auth["type"] == "auth_ok"
        assert ws.auth["ha_version"] == HA_VERSION
        states = ws.command("get_states")
        assert states["success"] is True
        assert {e.entity_id for e in FARM_ENTITIES} <= {s["entity_id"] for s in states["result"]}
        dashboards = ws.command("lovelace/dashboards/list")
        assert {"url_path": "farm-yaml", "mode": "yaml"}.items() <= next(
            d for d in dashboards["result"] if d["url_path"] == "farm-yaml"
        ).items()
        yaml_dashboard = ws.command("lovelace/config", url_path="farm-yaml")
        assert yaml_dashboard["result"]["views"][0]["path"] == "fields"
        never_saved = ws.command("lovelace/config", url_path=None)  # the default dashboard: storage mode
        assert never_saved["error"]["code"] == "config_not_found"
        url_path = f"probe-{secrets.token_hex(3)}"  # a new storage dashboard; the default one stays untouched
        created = ws.command("lovelace/dashboards/create", url_path=url_path, title="Probe", mode="storage")
        assert created["success"] is True, created
        saved = ws.command("lovelace/config/save", url_path=url_path, config={"views": [{"title": "Probe"}]})
        assert saved["success"] is True, saved
        assert ws.command("lovelace/config", url_path=url_path)["result"] == {"views": [{"title": "Probe"}]}
        assert ws.command("lovelace/dashboards/delete", dashboard_id=created["result"]["id"])["success"] is True
    with WsSession(ha_reset.ws_url, "not-" + ha_reset.token) as refused:
        assert refused.auth["type"] == "auth_invalid"


@pytest.mark.parametrize("entity", FARM_ENTITIES, ids=lambda e: e.entity_id)
def test_every_farm_entity_exists_with_its_device_class_and_unit(ha_reset: HaInstance, entity: FarmEntity) -> None:
    state = ha_reset.get_state(entity.entity_id)
    assert state["attributes"].get("device_class") == entity.device_class
    if entity.unit is not None:
        assert state["attributes"]["unit_of_measurement"] == entity.unit
    if entity.entity_id in FARM_DEFAULTS:
        default = FARM_DEFAULTS[entity.entity_id]
        assert (float(state["state"]) if isinstance(default, float) else state["state"]) == default


def test_an_unknown_entity_is_a_404(ha_reset: HaInstance) -> None:
    with pytest.raises(HaHttpError) as missing:
        ha_reset.get_state("sensor.no_such_probe")
    assert missing.value.status == 404


def test_input_numbers_drive_the_sensors_and_alerts(ha_reset: HaInstance) -> None:
    ha = ha_reset
    ha.set_number("input_number.field_1_soil_moisture_raw", 12.5)
    wait_for(lambda: _follows(ha, "sensor.field_1_soil_moisture", "12.5"), timeout=5, what="field 1 moisture")
    ha.set_number("sensor.field_2_soil_moisture", 61)  # a driven sensor id sets its input_number
    wait_for(lambda: _follows(ha, "sensor.field_2_soil_moisture", "61.0"), timeout=5, what="field 2 moisture")
    assert _state(ha, "binary_sensor.frost_risk") == "off"
    ha.set_number("sensor.air_temperature", 1.5)
    wait_for(lambda: _follows(ha, "binary_sensor.frost_risk", "on"), timeout=5, what="frost alert")
    assert _state(ha, "sensor.air_temperature") == "1.5"
    assert ha.get_state("weather.farm_weather")["attributes"]["temperature"] == 1.5
    ha.set_state("input_boolean.pump_fault_sim", True)
    wait_for(lambda: _follows(ha, "binary_sensor.pump_fault", "on"), timeout=5, what="pump fault")

    ha.reset()
    wait_for(lambda: _follows(ha, "binary_sensor.frost_risk", "off"), timeout=5, what="frost cleared by reset")
    for entity_id, expected in (("sensor.field_1_soil_moisture", "45.0"), ("binary_sensor.pump_fault", "off")):
        wait_for(lambda e=entity_id, x=expected: _follows(ha, e, x), timeout=5, what=f"{entity_id} reset")


@pytest.mark.parametrize(
    ("entity_id", "value", "expected", "driver", "driver_expected"),
    [
        ("switch.irrigation_pump", "on", "on", "input_boolean.pump_relay", "on"),
        ("switch.field_1_valve", True, "on", "input_boolean.field_1_valve_relay", "on"),
        ("light.barn_light", "on", "on", "input_boolean.barn_light_relay", "on"),
        ("fan.greenhouse_fan", True, "on", "input_boolean.greenhouse_fan_relay", "on"),
        ("number.irrigation_duration", 45, "45.0", "input_number.irrigation_duration_raw", "45.0"),
        ("select.fertigation_program", "bloom", "bloom", "input_select.fertigation_program_raw", "bloom"),
        ("input_select.irrigation_mode", "manual", "manual", "input_select.irrigation_mode", "manual"),
        ("input_select.weather_condition_raw", "snowy", "snowy", "input_select.weather_condition_raw", "snowy"),
    ],
)
def test_every_controllable_domain_can_be_set(
    ha_reset: HaInstance, entity_id: str, value: object, expected: str, driver: str, driver_expected: str
) -> None:
    assert isinstance(value, bool | int | str)
    ha_reset.set_state(entity_id, value)
    wait_for(lambda: _follows(ha_reset, entity_id, expected), timeout=5, what=f"{entity_id} = {expected}")
    assert _state(ha_reset, driver) == driver_expected
    if entity_id == "input_select.weather_condition_raw":
        assert _state(ha_reset, "weather.farm_weather") == "snowy"


def test_service_calls_return_the_changed_states(ha_reset: HaInstance) -> None:
    changed = ha_reset.call_service("switch", "turn_on", {"entity_id": "switch.irrigation_pump"})
    assert {s["entity_id"]: s["state"] for s in changed}.get("input_boolean.pump_relay") == "on"
    wait_for(lambda: _follows(ha_reset, "switch.irrigation_pump", "on"), timeout=5, what="pump on")


def test_the_farm_calendar_has_upcoming_events(ha_reset: HaInstance) -> None:
    now = datetime.now(UTC)
    start, end = quote(now.isoformat()), quote((now + timedelta(days=3)).isoformat())
    events = ha_reset.api("GET", f"/api/calendars/{CALENDAR_ENTITY}?start={start}&end={end}")
    assert [e["summary"] for e in events] == ["Irrigate field 1", "Fertigation (bloom)"]
    assert "+" in events[0]["start"]["dateTime"] or events[0]["start"]["dateTime"].endswith("Z")


def test_the_installed_release_is_read_from_the_venvs_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `installed_version` says of a cache, without starting HA's interpreter: only a complete venv counts."""
    monkeypatch.setenv("FARMHOST_HA_CACHE", str(tmp_path))
    venv = tmp_path / f"venv-{HA_VERSION}"
    site = venv / "lib" / "python3.13" / "site-packages"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (site / f"homeassistant-{HA_VERSION}.dist-info").mkdir(parents=True)
    (site / f"homeassistant-{HA_VERSION}.dist-info" / "METADATA").write_text(
        f"Name: homeassistant\nVersion: {HA_VERSION}\n"
    )
    (site / "homeassistant").mkdir()
    (site / "homeassistant" / "__main__.py").write_text("")
    assert installed_version() is None  # no .farmhost-complete: a half-finished install
    (venv / ".farmhost-complete").write_text("")
    assert installed_version() == HA_VERSION
    (site / "homeassistant" / "__main__.py").unlink()
    assert installed_version() is None  # the metadata without the package
    (site / "homeassistant" / "__main__.py").write_text("")
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "gone")
    assert installed_version() is None  # the interpreter is gone


def test_www_is_served_as_local_from_the_start(ha_reset: HaInstance) -> None:
    """The config dir has www/ before HA starts, so a file put there later is served at /local/ with no restart."""
    name = f"probe-{secrets.token_hex(4)}.txt"
    (ha_reset.config_dir / "www" / name).write_text("served")
    try:
        with urllib.request.urlopen(f"{ha_reset.url}/local/{name}", timeout=scaled(10)) as answer:
            assert answer.read() == b"served"
    finally:
        (ha_reset.config_dir / "www" / name).unlink()


@pytest.mark.slow
def test_restart_through_the_api_brings_it_back_running_with_the_same_token(ha_reset: HaInstance) -> None:
    ha = ha_reset
    ha.set_state("switch.irrigation_pump", "on")
    old_pid = ha.hass_pid()
    limit = scaled(45)  # computed once: the bound below is the deadline restart() was given, not a later guess
    took = ha.restart(timeout=limit)
    assert ha.hass_pid() != old_pid  # a new hass process: the supervisor restarted it after exit code 100
    assert (ha.root / "hass.rc").read_text().strip() == "100"
    assert ha.running()
    assert ha.core_state() == "RUNNING"
    assert took < limit
    with ha.ws() as ws:
        assert ws.auth["type"] == "auth_ok"
    ha.check_entities()  # template, fan and the calendar's config entry are all back
    assert _state(ha, "input_boolean.pump_relay") == "off"  # helpers have `initial:`, so a restart resets them
    # The hass that exited listed the modules it imported beyond the supervisor's, and the supervisor imported
    # them before it forked this one (supervisor.py): after one more restart, what this hass listed leaves out the
    # farm's integrations, which it found imported.
    assert re.search(r"supervisor: imported [1-9][0-9]* modules hass used before", ha.log_path.read_text())
    ha.restart(timeout=limit)
    ha.check_entities()
    listed = (ha.root / "hass.modules").read_text().split()
    assert not {"homeassistant.components.template", "homeassistant.components.recorder"} & set(listed), listed


@pytest.mark.slow
def test_stop_and_start_again_on_the_same_url_and_token(ha_reset: HaInstance) -> None:
    ha = ha_reset
    url, token = ha.url, ha.token
    assert ha.stop() == 0  # SIGTERM: a clean exit
    assert not ha.running()
    assert ha.core_state() is None  # nothing answers on the port
    # Back within the start's own deadline (a fresh start takes about 5 s idle; a loaded 2-core machine can take
    # many times that, so no tighter wall-clock bound than the deadline, computed once, is asserted).
    limit = scaled(60)
    assert ha.start(timeout=limit) < limit
    assert (ha.url, ha.token) == (url, token)
    assert ha.core_state() == "RUNNING"
    ha.check_entities()


@pytest.mark.slow
def test_taken_down_it_is_off_until_started_again_by_the_same_supervisor_with_a_forked_hass(
    ha_reset: HaInstance,
) -> None:
    """`take_down` stops hass and keeps its supervisor; `ensure_running` brings a new hass, forked from it."""
    ha = ha_reset
    supervisor, old_pid = (ha.root / "supervisor.pid").read_text(), ha.hass_pid()
    assert ha.take_down(timeout=scaled(30)) == 0  # SIGTERM to hass: a clean exit
    assert ha.running()  # the supervisor waits
    assert ha.core_state() is None  # nothing answers on the port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ha.port), timeout=scaled(5)).close()
    ha.ensure_running(timeout=scaled(60))
    assert ha.core_state() == "RUNNING" and ha.hass_pid() != old_pid
    assert (ha.root / "supervisor.pid").read_text() == supervisor
    ha.check_entities()
    log = ha.log_path.read_text()
    assert "taken down on request (SIGUSR1): kept down until SIGUSR2" in log
    # Every hass of this instance was forked from the supervisor that had imported HA (none ran as a new process).
    assert "starting hass forked from the preloaded supervisor" in log and "starting hass as a new process" not in log


def test_a_supervisor_run_by_another_interpreter_starts_hass_as_a_new_process(tmp_path: Path) -> None:
    """Not HA's interpreter: nothing to preload, so hass runs as `python -m homeassistant` (its output in the log)."""
    log, pid_file = tmp_path / "hass.log", tmp_path / "hass.pid"
    argv = ["--python", sys.executable, "--config", str(tmp_path / "config"), "--log", str(log), "--pid-file"]
    done = subprocess.run([sys.executable, supervisor.__file__, *argv, str(pid_file)], timeout=scaled(60), check=False)
    assert done.returncode == 1  # this interpreter has no homeassistant to run
    text = log.read_text()
    assert "starting hass as a new process" in text and "No module named homeassistant" in text
    assert "hass exited 1, done" in text and (tmp_path / "hass.rc").read_text() == "1\n"


def test_the_supervisor_imports_what_hass_listed_skips_what_fails_and_stops_forking_once_a_thread_runs(
    tmp_path: Path,
) -> None:
    """`Supervisor.learn` in a process of its own (a pytest worker has threads of its own): stdlib modules only."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "cached.py").write_text("VALUE = 0\n")
    (tmp_path / "mods" / "fine.py").write_text("VALUE = 1\n")
    (tmp_path / "mods" / "broken.py").write_text("raise RuntimeError('broken on import')\n")
    (tmp_path / "mods" / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    (tmp_path / "venv").mkdir()
    script = f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(tmp_path / "mods")!r})
from farmhost.localha.supervisor import Supervisor, write_modules
cache = Path({str(tmp_path / "venv" / "hass.modules")!r})
write_modules(cache, ["cached"])  # what the hass processes of an earlier supervisor used
sup = Supervisor(sys.executable, "config", {str(tmp_path / "hass.pid")!r}, None, str(cache))
sup.fork = True  # as if HA were preloaded: this interpreter has none
modules = Path({str(tmp_path / "hass.modules")!r})
lines = [sup.learn(), sup.learn(cached=True)]
write_modules(modules, ["fine", "broken"])  # as a forked hass leaves it
lines += [sup.learn(), sup.fork, "fine" in sys.modules, "broken" in sys.modules, sup.learn()]
lines += [cache.read_text().split()]
write_modules(modules, ["threaded"])
lines += [sup.learn(), sup.fork, sorted(p.name for p in modules.parent.iterdir())]
print(json.dumps(lines))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(60), check=False
    )
    assert done.returncode == 0, done.stderr
    (no_file, from_cache, fine, forks, has_fine, has_broken, again, cache, threaded, forks_after, files) = json.loads(
        done.stdout
    )
    assert no_file is None  # nothing listed by a hass of this supervisor yet: nothing to say
    assert from_cache == "imported 1 modules hass used before"  # at its start, what the cache lists
    assert fine == "imported 1 modules hass used before" and forks and has_fine and not has_broken
    assert again is None  # nothing new
    assert cache == ["cached", "fine"]  # what it imported from the lists, for the next supervisor
    assert "one started a thread, so hass runs as a new process" in threaded and not forks_after
    assert files == ["hass.modules", "mods", "venv"]  # each list written whole under another name, then renamed
