"""farmhost as a device in Home Assistant over MQTT: the real daemon, a real Mosquitto, a real MQTT client as HA.

Discovery is one retained device config; availability is `online` while connected and `offline` by the last
will after a kill -9 (or by a goodbye on a clean stop); Home Assistant's birth message brings the config again;
the `Agents paused` switch pauses and resumes, survives a restart, and a retained command is not acted on; a
broker that is down never keeps the daemon from answering, and it connects when the broker comes.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, clean_env, drop, once_time, scaled, wait_for, wait_result
from mosquitto import Mosquitto
from mqtt_support import watching

SITE = "pumphouse"
BASE = f"farmhost/{SITE}"
CONFIG = f"homeassistant/device/farmhost_{SITE}/config"
AVAILABILITY = f"{BASE}/availability"
STATE = f"{BASE}/state"
PAUSE = f"{BASE}/command/agents_paused"


@contextmanager
def _daemon(data_dir: Path, url: str) -> Iterator[Daemon]:
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_MQTT_URL=url, FARMHOST_SITE=SITE)).start(timeout=30)
    try:
        yield daemon
    finally:
        if daemon.proc is not None:
            daemon.stop()


def _task_run(data_dir: Path, task_id: str) -> dict[str, Any] | None:
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute(
            "SELECT * FROM task_runs WHERE task_id = ? AND finished_at IS NOT NULL", (task_id,)
        ).fetchone()
        return dict(row) if row else None


def _ping(data_dir: Path, rid: str) -> dict[str, object]:
    drop(data_dir, "main", "actions", {"type": "ping", "requestId": rid})
    return wait_result(data_dir, "main", rid, timeout=20)


def test_the_daemon_is_a_device_in_home_assistant_with_its_sensors_switch_and_availability(
    data_dir: Path, mosquitto: Mosquitto
) -> None:
    with watching(mosquitto.port, CONFIG, AVAILABILITY, STATE) as ha, _daemon(data_dir, mosquitto.url()) as daemon:
        config = ha.wait(CONFIG)[-1].json()
        assert ha.wait(AVAILABILITY, where=lambda m: m.payload == "online")
        state = ha.wait(STATE)[-1].json()
        ha.publish("homeassistant/status", "online")  # HA restarted: it asks everyone to announce again
        ha.wait(CONFIG, 2)
        assert "Traceback" not in daemon.log()
        daemon.stop(signal.SIGKILL)
        gone = ha.wait(AVAILABILITY, where=lambda m: m.payload == "offline")  # the broker sends the last will

    assert gone[-1].payload == "offline"
    assert config["device"]["identifiers"] == [f"farmhost_{SITE}"] and config["origin"]["name"] == "farmhost"
    assert config["availability_topic"] == AVAILABILITY and config["state_topic"] == STATE
    components = config["components"]
    platforms = {key: c["platform"] for key, c in components.items()}
    assert platforms["runs_running"] == platforms["outbox_failed"] == platforms["llm_tokens_today"] == "sensor"
    assert platforms["connected"] == "binary_sensor" and components["connected"]["device_class"] == "connectivity"
    assert platforms["alert"] == "event" and "frost" in components["alert"]["event_types"]
    assert platforms["agents_paused"] == "switch" and components["agents_paused"]["command_topic"] == PAUSE
    assert all(c["unique_id"].startswith(f"farmhost_{SITE}_") for c in components.values())
    for key, component in components.items():  # every sensor reads a key the state has
        if "value_template" in component:
            assert component["value_template"] == f"{{{{ value_json.{key} }}}}" and key in state
    assert state["agents_paused"] == "OFF" and state["outbox_failed"] == 0 and state["runs_running"] == 0


def test_agents_paused_from_home_assistant_stays_paused_across_a_restart_and_a_retained_command_is_ignored(
    data_dir: Path, mosquitto: Mosquitto
) -> None:
    paused = lambda m: json.loads(m.payload)["agents_paused"] == "ON"
    running = lambda m: json.loads(m.payload)["agents_paused"] == "OFF"
    with watching(mosquitto.port, STATE) as ha:
        with _daemon(data_dir, mosquitto.url()) as daemon:
            ha.wait(STATE, where=running)
            ha.publish(PAUSE, "ON")
            ha.wait(STATE, where=paused)
            ha.publish(PAUSE, "ON")  # QoS 1 may deliver twice: nothing changes twice
            assert "agent runs paused" in daemon.log() and daemon.log().count("agent runs paused:") == 1
            # A scheduled task due now is not run while paused; its run is recorded with the reason.
            due = once_time(data_dir, "main", UTC).isoformat()
            task = {"type": "schedule_task", "requestId": "r-task", "taskId": "t-water", "prompt": "water field 1"}
            drop(data_dir, "main", "tasks", {**task, "schedule_type": "once", "schedule_value": due})
            assert wait_result(data_dir, "main", "r-task", timeout=20)["status"] == "success"
            run = wait_for(lambda: _task_run(data_dir, "t-water"), timeout=scaled(30), what="the task's run")
            assert "agent runs are paused (paused by Home Assistant (MQTT)" in (run["detail"] or "")
            daemon.stop()
        with _daemon(data_dir, mosquitto.url()) as daemon:
            before = len(ha.on(STATE))
            ha.wait(STATE, before + 1, where=paused)  # still paused after the restart
            ha.publish(PAUSE, "OFF")
            ha.wait(STATE, where=running)
            # Retained by mistake: delivered live it is a command like any other (it pauses once), but the broker
            # hands it again at every new subscription, with the retain flag: that copy must not act.
            ha.publish(PAUSE, "ON", retain=True)
            ha.wait(STATE, where=paused)
            ha.publish(PAUSE, "OFF")
            ha.wait(STATE, where=running)
            daemon.stop()
        with _daemon(data_dir, mosquitto.url()) as daemon:
            wait_for(lambda: "ignored a retained command 'ON'" in daemon.log(), timeout=scaled(20), what="the ignore")
            before = len(ha.on(STATE))
            ha.publish("homeassistant/status", "online")  # ask for the state now
            ha.wait(STATE, before + 1)
            assert json.loads(ha.on(STATE)[-1].payload)["agents_paused"] == "OFF"
            assert "Traceback" not in daemon.log()


def test_a_broker_that_is_down_never_keeps_the_daemon_from_answering_and_it_connects_when_the_broker_comes(
    data_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "late-broker"
    root.mkdir()
    broker = Mosquitto(root)  # configured, not started
    with _daemon(data_dir, broker.url()) as daemon:
        assert _ping(data_dir, "r-ping-no-broker")["status"] == "success"
        broker.start()
        try:
            with watching(broker.port, CONFIG, AVAILABILITY) as ha:
                ha.wait(CONFIG, timeout=60)
                broker.kill()  # mid-traffic
                assert _ping(data_dir, "r-ping-broker-killed")["status"] == "success"
                broker.start()
            with watching(broker.port, AVAILABILITY) as ha:
                ha.wait(AVAILABILITY, where=lambda m: m.payload == "online", timeout=60)
            assert "Traceback" not in daemon.log()
        finally:
            broker.kill()


@pytest.mark.parametrize("url", ["http://127.0.0.1:1883", "mqtt://:1883", "mqtt://127.0.0.1:99999"])
def test_a_wrong_broker_url_stops_the_daemon_with_a_sentence_naming_the_setting(data_dir: Path, url: str) -> None:
    from farmhost_testing import farmhost

    done = farmhost("doctor", data_dir=data_dir, env=clean_env(FARMHOST_MQTT_URL=url))
    assert "FARMHOST_MQTT_URL" in done.stdout + done.stderr


def test_the_switch_never_lifts_an_emergency_stop_made_in_the_main_chat(data_dir: Path, mosquitto: Mosquitto) -> None:
    # On the Mosquitto add-on's default ACL every broker login may write the command topic: an OFF from any of them
    # resumed agents the farmer had stopped with /stop. Only /resume in the main chat lifts that pause.
    stopped = "stopped by /stop (Ana (telegram:1001), 2026-12-08 06:00 UTC)"
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn, conn:
        conn.execute("INSERT INTO host_state (key, value) VALUES ('agents_paused', ?)", (stopped,))
    paused = lambda m: json.loads(m.payload)["agents_paused"] == "ON"
    with watching(mosquitto.port, STATE) as ha, _daemon(data_dir, mosquitto.url()) as daemon:
        ha.wait(STATE, where=paused)
        before = len(ha.on(STATE))
        ha.publish(PAUSE, "OFF")
        ha.wait(STATE, before + 1, where=paused)  # the switch is set back at once: still paused
        refusal = "mqtt: the switch did not resume them: the agents were stopped by /stop"
        wait_for(lambda: refusal in daemon.log(), timeout=scaled(20), what="the refusal in the log")
        assert "/resume in the main chat" in daemon.log()
        assert "agent runs resumed" not in daemon.log()
        ha.publish(PAUSE, "ON")  # pausing is always allowed, and keeps the stop's reason
        ha.publish("homeassistant/status", "online")
        ha.wait(STATE, len(ha.on(STATE)) + 1, where=paused)
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn:
        (reason,) = conn.execute("SELECT value FROM host_state WHERE key = 'agents_paused'").fetchone()
    assert reason == stopped


def test_a_huge_command_on_the_switch_topic_is_logged_by_its_start_retained_or_not(
    data_dir: Path, mosquitto: Mosquitto
) -> None:
    # Any broker account the ACL lets write the command topic (on the Mosquitto add-on's default, every login) can
    # leave a retained 64 KiB payload there: it came back at every (re)connection as one 64 KiB log line.
    huge = "ON" + "X" * 65536
    with watching(mosquitto.port, STATE) as ha:
        ha.publish(PAUSE, huge, retain=True)
        with _daemon(data_dir, mosquitto.url()) as daemon:
            wait_for(lambda: "ignored a retained command 'ONXXX" in daemon.log(), timeout=scaled(20), what="it")
            ha.publish(PAUSE, "OFF" + "Y" * 65536)
            wait_for(lambda: "ignored 'OFFYYY" in daemon.log(), timeout=scaled(20), what="the live one")
            ha.publish("homeassistant/status", "online")
            ha.wait(STATE, where=lambda m: json.loads(m.payload)["agents_paused"] == "OFF")
            lines = daemon.log().splitlines()
    assert max(len(line) for line in lines) < 400, max(lines, key=len)[:200]


@pytest.mark.parametrize(
    "url",
    ["mqtt//farm:hunter2@broker:1883", "mqtt:farm:hunter2@broker:1883", "mqtt://farm:hunter2@[broker:1883"],
)
def test_a_broker_url_mistyped_is_refused_without_showing_its_password(data_dir: Path, url: str) -> None:
    from farmhost_testing import farmhost

    done = farmhost("doctor", data_dir=data_dir, env=clean_env(FARMHOST_MQTT_URL=url))
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "FARMHOST_MQTT_URL" in said and "mqtt://user:password@host:1883" in said, said
    assert "hunter2" not in said and "Traceback" not in said, said
