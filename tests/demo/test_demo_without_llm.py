"""`farmhost demo` without an LLM: the night frost, the pump watering a field, the end of stdin, SIGTERM, reuse.

Without FARMHOST_LLM_* the demo says how to configure a model (Ollama and OpenAI examples) and everything else
keeps running: the simulated night brings a frost (binary_sensor.frost_risk on in HA), the pump with field 2's
valve open waters field 2 until the pump faults, a value set by hand in HA is where the simulation carries on
from, chat lines are answered by Home Assistant's Assist (with a one-time notice) and act on the farm, and after stdin ends the simulator still moves the farm until a
signal. `--keep-ha` leaves HA running at the stop; the next demo on the same data dir
reuses it (no second HA start) and, without `--keep-ha`, stops it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from demo_support import (
    alive,
    call_service,
    changed_soil,
    demo,
    get_state,
    ha_answers,
    kill_ha,
    login,
    require_cached_ha,
)
from farmhost_testing import clean_env, scaled, wait_for

pytestmark = pytest.mark.slow  # end to end, many seconds each (make test-fast leaves it out)

FIELD_1_RAW = "input_number.field_1_soil_moisture_raw"


def test_without_an_llm_the_demo_explains_the_farm_lives_on_and_a_kept_ha_is_reused(tmp_path: Path) -> None:
    require_cached_ha()
    data_dir = tmp_path / "demo-data"
    env = clean_env(FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_DAILY_REPORT="00:00")  # always passed: shown at start
    try:
        _no_llm_then_reuse(data_dir, env)
    finally:
        kill_ha(data_dir)  # whatever failed, the kept HA goes


def _no_llm_then_reuse(data_dir: Path, env: dict[str, str]) -> None:
    args = ("--port", "0", "--tick", "2", "--start-hour", "0", "--no-screenshot", "--keep-ha")
    with demo(data_dir, *args, env=env, leave_ha=True) as run:
        run.wait_line("Chat: type a message", timeout=45)
        where = run.summary()
        assert where["LLM"] == "not configured (see below)"
        assert where["Screenshot"] == "(off: --no-screenshot)"
        howto = run.wait_line("OpenRouter, llama.cpp and vLLM work the same way")
        text = run.output()
        assert text.index("No LLM is configured") < text.index(howto)
        for example in (
            "FARMHOST_LLM_BASE_URL=http://127.0.0.1:11434/v1",  # Ollama
            "FARMHOST_LLM_BASE_URL=https://api.openai.com/v1",
            "FARMHOST_LLM_API_KEY=sk-...",
        ):
            assert example in text

        url = where["Home Assistant"]
        username, password = where["Login"].split(" / ")
        token = login(url, username, password)

        # The demo farm's safe profile is in force, and Assist is kept away from what it limits.
        assert "wrote the demo farm's safe profile" in text
        run.wait_line("Good morning. The farm from", timeout=15)  # the morning report, in the terminal chat
        rules = json.loads((data_dir / "farm-profile.json").read_text())["policy"]["rules"]
        assert {"entities": ["switch.irrigation_pump"], "maxOnSeconds": 1800} in rules
        hidden = run.wait_line("not exposed to Assist (the farm profile limits them)")
        assert "switch.field_1_valve" in hidden and "switch.irrigation_pump" not in hidden

        # Midnight on the farm (--start-hour 0): the frost comes within a farm hour.
        run.wait_line("frost: the air is", timeout=10)
        wait_for(lambda: get_state(url, token, "binary_sensor.frost_risk")["state"] == "on", timeout=5, what="frost")
        assert float(get_state(url, token, "sensor.air_temperature")["state"]) < 2

        # The pump with field 2's valve open waters field 2 (and only field 2).
        dry = float(get_state(url, token, "sensor.field_2_soil_moisture")["state"])
        for switch in ("switch.irrigation_pump", "switch.field_2_valve"):
            call_service(url, token, "switch", "turn_on", {"entity_id": switch})
        run.wait_line("field 2 is being watered", timeout=5)
        wait_for(
            lambda: float(get_state(url, token, "sensor.field_2_soil_moisture")["state"]) > dry + 1,
            timeout=5,
            what="field 2 getting wetter",
        )
        assert "field 1 is being watered" not in run.output()
        # A pump fault stops the water; a value set in HA by hand is where the simulation carries on from.
        call_service(url, token, "input_boolean", "turn_on", {"entity_id": "input_boolean.pump_fault_sim"})
        run.wait_line("field 2 is no longer watered", timeout=5)
        call_service(url, token, "input_number", "set_value", {"entity_id": FIELD_1_RAW, "value": 80})
        soil_1 = wait_for(lambda: _field_1_below_80(url, token), timeout=5, what="field 1 drying from 80 %")
        assert soil_1 > 78

        # No LLM: Home Assistant's Assist answers the chat and acts on the farm; the notice comes once.
        run.send("turn on the barn light")
        run.wait_line("you: turn on the barn light")
        run.wait_line("(Answers in this chat come from Home Assistant's own assistant (Assist), because no LLM")
        run.wait_line("farm bot: Turned on the light")
        assert get_state(url, token, "light.barn_light")["state"] == "on"
        run.send("what is the soil moisture of field 1")
        run.wait_line(lambda line: line.startswith("farm bot: Soil moisture of field 1 is "))
        run.send("is the barn light on")
        run.wait_line("farm bot: Yes")
        call_service(url, token, "switch", "turn_off", {"entity_id": "switch.irrigation_pump"})
        run.send("turn on the irrigation pump")
        run.wait_line("farm bot: Turned on the switch")
        assert get_state(url, token, "switch.irrigation_pump")["state"] == "on"
        assert run.output().count("Answers in this chat come from") == 1

        run.close_stdin()
        run.wait_line("[demo] end of input: the chat is closed; the demo keeps running until Ctrl-C")
        changed_soil(url, token, timeout=5)  # the farm goes on after the end of input
        assert run.proc.poll() is None

        first_ha = run.ha_pids()
        assert run.stop(signal.SIGTERM) == 0, run.output()
        assert run.output().splitlines()[-1] == "[demo] stopped (exit status 0)"
        assert "Home Assistant keeps running" in run.output()
    assert all(alive(pid) for pid in first_ha) and ha_answers(url)  # --keep-ha

    with demo(data_dir, "--no-chat", "--no-screenshot", env=env) as again:
        started = time.monotonic()
        again.wait_line("Stop: Ctrl-C", timeout=30)
        assert time.monotonic() - started < scaled(20)
        output = again.output()
        assert f"[ha] reusing the Home Assistant already running at {url}" in output
        assert "starting Home Assistant" not in output
        assert again.summary()["Home Assistant"] == url
        assert login(url, username, password)  # the demo user's password is set again on the reused instance
        assert again.stop(signal.SIGINT) == 0, again.output()
        assert "[ha] Home Assistant stopped (exit code 0)" in again.output()
    wait_for(lambda: not any(alive(pid) for pid in first_ha), timeout=2, what="the kept HA is stopped")
    assert not ha_answers(url)


def _field_1_below_80(url: str, token: str) -> float | None:
    value = float(get_state(url, token, "sensor.field_1_soil_moisture")["state"])
    return value if value < 80 else None
