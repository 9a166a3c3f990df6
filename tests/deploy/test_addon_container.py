"""The Home Assistant add-on's image, run the way the Supervisor runs it, against real parts standing around it.

scripts/docker-images builds `farmhost-addon:test` from Dockerfile.amd64 with BUILD_FROM=farmhost-base:bookworm
(for Home Assistant's amd64-base-debian:bookworm). Here the container gets what the Supervisor gives an add-on
with config.yaml's settings: /data with options.json (written by the test), SUPERVISOR_TOKEN, TZ, seccomp
unconfined (supervisor/docker/interface.py), no added capability, no Docker socket. http://supervisor is
tests/supervisor_stub.py, a real HTTP server on the host's loopback (FARMHOST_SUPERVISOR_URL points the add-on at
it; the container shares the host's network) that proxies /core/api/* and /core/websocket to the test Home
Assistant with its own token and answers /services/mqtt with a login on the test Mosquitto.

Not here: the Supervisor itself, its AppArmor profile (this machine has no AppArmor), the Home Assistant base
image (it cannot be pulled here) and arm64. Without an engine the test skips, saying so; without the image it fails.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from docker_engine import ADDON_IMAGE, docker, image, requires_engine
from farmhost_testing import MAIN_JID, drop, ok, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from llm_stub import Recorded, Reply, ScriptedLLM, ToolCall
from mosquitto import Mosquitto
from paho.mqtt.enums import CallbackAPIVersion
from supervisor_stub import MqttGrant, SupervisorStub, running_supervisor

pytestmark = [requires_engine, pytest.mark.slow, pytest.mark.timeout(240)]

COUNTER = "input_number.irrigation_duration_raw"  # a helper of the test instance's simulated farm
MAIN_CHAT_ID = int(MAIN_JID.removeprefix("telegram:"))
RUN_UID = 1000  # farmhost addon-run drops to it
DEVICE_CONFIGS = "homeassistant/device/+/config"  # MQTT discovery of a device (docs/mqtt.md)


def health(name: str) -> str:
    done = docker("inspect", "-f", "{{if .State.Health}}{{.State.Health.Status}}{{end}} {{.State.Status}}", name)
    return done.stdout.strip() if done.returncode == 0 else f"inspect failed: {done.stderr.strip()}"


def logs(name: str) -> str:
    done = docker("logs", name)
    return done.stdout + done.stderr


def in_container(name: str, *args: str) -> Any:
    """`farmhost <args> --json`, run in the container as the daemon's user (as a farmer's `docker exec` would)."""
    done = docker("exec", "-u", str(RUN_UID), name, "farmhost", *args, "--json", timeout=scaled(60))
    assert done.returncode in (0, 1), done.stdout + done.stderr  # doctor exits 1 when a part is broken
    return json.loads(done.stdout)


@contextmanager
def subscribed(port: int, topic: str, *, user: str, password: str) -> Iterator[list[str]]:
    """The payloads published on `topic` while inside, as Home Assistant's MQTT integration would receive them."""
    payloads: list[str] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.username_pw_set(user, password)
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    client.on_message = lambda _c, _u, message: payloads.append(message.payload.decode())
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        yield payloads
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"farmhost-addon-test-{secrets.token_hex(4)}"
    yield name
    docker("rm", "-f", name)


def test_the_add_on_starts_as_the_supervisor_starts_it_and_finds_home_assistant_and_mqtt_through_it(
    tmp_path: Path, ha_reset: HaInstance, container_name: str
) -> None:
    addon_image = image(ADDON_IMAGE)
    broker_root = tmp_path / "mosquitto"
    broker_root.mkdir()
    broker = Mosquitto(broker_root, users={"addons": "mqtt-pw-of-addons", "homeassistant": "ha-pw"}).start()
    data = tmp_path / "data"
    data.mkdir()
    held = threading.Event()
    release = threading.Event()

    def hold(_: Recorded) -> ToolCall:
        held.set()
        release.wait(scaled(60))
        return ToolCall("send_message", {"chatJid": MAIN_JID, "text": "Soil is fine."})

    token = secrets.token_hex(32)
    stub = SupervisorStub(
        token=token,
        ha_url=ha_reset.url,
        ha_token=ha_reset.farmhost_token,
        mqtt=MqttGrant(host="127.0.0.1", port=broker.port, username="addons", password="mqtt-pw-of-addons"),
    )
    try:
        with (
            running_supervisor(stub) as supervisor,
            ScriptedLLM([hold, Reply("Told them.")]) as llm,
            subscribed(broker.port, DEVICE_CONFIGS, user="homeassistant", password="ha-pw") as announced_configs,
        ):
            options = {
                # what the farmer typed in HA's UI (no Telegram token: that part stays off, and the log says so)
                "main_chat_id": MAIN_CHAT_ID,
                "main_chat_name": "Farm office",
                "llm_base_url": llm.base_url,
                "llm_model": "farm-model",
                "llm_api_key": "sk-addon-test",
                "farm_mode": "demo",
                "farm_profile": "../etc/passwd",
                "log_level": "INFO",
            }
            (data / "options.json").write_text(json.dumps(options))
            started = docker(
                "run", "-d", "--name", container_name,
                "--network", "host", "--security-opt", "seccomp=unconfined",
                "-v", f"{data}:/data",
                "-e", f"SUPERVISOR_TOKEN={token}", "-e", f"FARMHOST_SUPERVISOR_URL={supervisor.url}", "-e", "TZ=UTC",
                "--health-interval", "1s",
                addon_image,
            )  # fmt: skip
            assert started.returncode == 0, started.stderr
            wait_for(lambda: health(container_name).startswith("healthy "), timeout=60, interval=0.5,
                     what="the add-on to be healthy", seen=lambda: logs(container_name)[-3000:])  # fmt: skip

            # One clear line for each option that is missing or wrong; the secrets never in the log.
            log = logs(container_name)
            assert "option telegram_bot_token is missing: farmhost does not talk to Telegram" in log, log[-3000:]
            assert "option farm_profile: String should match pattern" in log, log[-3000:]
            assert "sk-addon-test" not in log and token not in log and "mqtt-pw-of-addons" not in log

            root = data / "farmhost"
            pinged = drop(root, "main", "actions", {"type": "ping"})
            assert ok(wait_result(root, "main", pinged, timeout=20))["pong"] is True
            # Home Assistant through the Supervisor's proxy, with the add-on's token (the stub swaps in its own).
            asked = {"type": "farm_action", "action": "ha_get_status", "params": {"entityIds": [COUNTER]}}
            status = ok(wait_result(root, "main", drop(root, "main", "actions", asked), timeout=30))
            (state,) = status["states"]
            expected = ha_reset.api("GET", f"/api/states/{COUNTER}")["state"]
            assert state["entity_id"] == COUNTER and state["state"] == expected, status
            seen = stub.requests()
            assert ("GET", "/services/mqtt", True) in seen, seen
            assert any(path.startswith("/core/api/") for _, path, _ in seen), seen
            assert all(token_ok for *_, token_ok in seen), seen

            # farmhost is a device in Home Assistant, on the broker the Supervisor named, with its login.
            (announced, *_) = wait_for(
                lambda: list(announced_configs),
                timeout=30,
                what="farmhost's device config on the broker",
            )
            assert json.loads(announced)["device"]["name"], announced

            # An agent run in the add-on's sandbox: bwrap, as uid 1000, the LLM through the proxy socket.
            due = (datetime.now(UTC) + timedelta(seconds=scaled(2))).strftime("%Y-%m-%dT%H:%M:%S")
            task = {
                "type": "schedule_task",
                "prompt": "Check the soil.",
                "schedule_type": "once",
                "schedule_value": due,
            }
            ok(wait_result(root, "main", drop(root, "main", "tasks", task), timeout=20))
            wait_for(held.is_set, timeout=60, interval=0.2, what="the agent run's first LLM request",
                     seen=lambda: logs(container_name)[-3000:])  # fmt: skip
            release.set()
            entries = wait_for(lambda: in_container(container_name, "outbox", "list"), timeout=30, interval=0.5,
                               what="the agent's message in the outbox")  # fmt: skip
            assert [(e["chatJid"], e["body"]) for e in entries] == [(MAIN_JID, "Soil is fine.")], entries
            (request, _) = llm.requests
            assert request.headers["authorization"] == "Bearer sk-addon-test" and request.model == "farm-model"

            # doctor in the container says what holds there: bwrap, the container's /proc, no cgroup per run.
            checks = in_container(container_name, "doctor")
            lines = {(c["part"], c["state"]): c["detail"] for c in checks}
            assert ("sandbox", "ok") in lines and ("seccomp", "ok") in lines, checks
            assert "FARMHOST_SANDBOX_PROC=container" in lines[("sandbox", "warn")], checks
            assert "cgroup" in lines.get(("agent limits", "warn"), ""), checks  # runs start, with rlimits only
            assert ("home assistant", "ok") in lines and ("mqtt", "ok") in lines, checks
    finally:
        release.set()
        broker.kill()
    (run_log,) = sorted((data / "farmhost" / "logs" / "runs" / "main").glob("run-*.log"))
    text = run_log.read_text()
    assert "bwrap" in text and "--ro-bind /proc /proc" in text, text[:2000]
    stopped = docker("stop", "-t", "15", container_name, timeout=scaled(60))
    assert stopped.returncode == 0, stopped.stderr
    assert docker("inspect", "-f", "{{.State.ExitCode}}", container_name).stdout.strip() == "0", logs(container_name)
    assert "Traceback" not in logs(container_name), logs(container_name)[-3000:]
    # The data dir is the daemon's user's, as addon-run left it; options.json stays the Supervisor's (root's).
    assert (data / "farmhost" / "farmhost.db").stat().st_uid == RUN_UID
