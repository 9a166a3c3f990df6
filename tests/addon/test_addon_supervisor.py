"""The add-on's view of the Supervisor, against tests/supervisor_stub.py (a real HTTP server) and the test HA."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from farmhost_testing import clean_env, farmhost
from ha_fixture import HaInstance
from supervisor_stub import MqttGrant, SupervisorStub, running_supervisor

from farmhost.addon.options import AddonOptions
from farmhost.addon.run import addon_environment
from farmhost.addon.supervisor import MqttService, Supervisor, SupervisorError

GRANT = MqttGrant(host="core-mosquitto", port=1883, username="addons", password="p@ss:w/rd")


def test_the_broker_comes_from_the_services_api_with_its_login() -> None:
    token = secrets.token_hex(16)
    with running_supervisor(SupervisorStub(token=token, ha_url="http://unused", ha_token="x", mqtt=GRANT)) as stub:
        service = Supervisor(url=stub.url, token=token).mqtt()
        assert service == MqttService(host="core-mosquitto", port=1883, ssl=False, username="addons",
                                      password="p@ss:w/rd")  # fmt: skip
        assert service.url == "mqtt://addons:p%40ss%3Aw%2Frd@core-mosquitto:1883"
        assert "p@ss" not in repr(service)
        with pytest.raises(SupervisorError, match="refused GET /services/mqtt: 401"):
            Supervisor(url=stub.url, token="not-the-add-ons").mqtt()
        assert stub.requests() == [("GET", "/services/mqtt", True), ("GET", "/services/mqtt", False)]
    with running_supervisor(SupervisorStub(token=token, ha_url="http://unused", ha_token="x")) as stub:
        assert Supervisor(url=stub.url, token=token).mqtt() is None  # no Mosquitto add-on: "Service not enabled"


def test_no_supervisor_is_a_clear_error_and_no_token_is_no_supervisor() -> None:
    with running_supervisor(SupervisorStub(token="t", ha_url="http://unused", ha_token="x")) as stub:
        url = stub.url
    with pytest.raises(SupervisorError, match="did not answer GET /services/mqtt"):
        Supervisor(url=url, token="t").mqtt()
    assert Supervisor.from_env({}) is None
    found = Supervisor.from_env({"SUPERVISOR_TOKEN": "abc", "FARMHOST_SUPERVISOR_URL": "http://127.0.0.1:9/"})
    assert found == Supervisor(url="http://127.0.0.1:9", token="abc") and found.ha_url == "http://127.0.0.1:9/core"
    assert Supervisor.from_env({"SUPERVISOR_TOKEN": "abc"}) == Supervisor(url="http://supervisor", token="abc")


def test_the_environment_carries_the_options_home_assistant_and_the_broker() -> None:
    token = secrets.token_hex(16)
    options = AddonOptions(telegram_bot_token="1:a", llm_base_url="http://llm/v1", llm_model="m",
                           farm_profile="farm.json")  # fmt: skip
    with running_supervisor(SupervisorStub(token=token, ha_url="http://unused", ha_token="x", mqtt=GRANT)) as stub:
        env = addon_environment(options, Supervisor(url=stub.url, token=token), {"TZ": "Europe/Lisbon"})
    assert env["HA_URL"] == f"{stub.url}/core" and env["HA_TOKEN"] == token
    assert env["FARMHOST_MQTT_URL"] == GRANT_URL
    assert env["TELEGRAM_BOT_TOKEN"] == "1:a" and env["FARM_PROFILE_PATH"] == "/config/farm.json"
    assert env["TZ"] == "Europe/Lisbon" and env["FARMHOST_DATA_DIR"] == "/data/farmhost"
    assert (env["FARMHOST_AGENT_RUNTIME"], env["FARMHOST_SANDBOX_PROC"]) == ("bwrap", "container")
    assert "FARMHOST_LLM_API_KEY" not in env  # an option left empty sets nothing


GRANT_URL = "mqtt://addons:p%40ss%3Aw%2Frd@core-mosquitto:1883"


def test_home_assistant_through_the_supervisors_proxy_answers_doctor(tmp_path: Path, ha_reset: HaInstance) -> None:
    token = secrets.token_hex(16)
    stub = SupervisorStub(token=token, ha_url=ha_reset.url, ha_token=ha_reset.farmhost_token)
    with running_supervisor(stub):
        supervisor = Supervisor(url=stub.url, token=token)
        env = clean_env(HA_URL=supervisor.ha_url, HA_TOKEN=token)
        done = farmhost("doctor", "--json", data_dir=tmp_path / "data", env=env)
    checks = {c["part"]: c for c in json.loads(done.stdout)}
    assert checks["home assistant"]["state"] == "ok", checks["home assistant"]
    seen = stub.requests()
    assert ("GET", "/core/api/", True) in seen and ("GET", "/core/api/websocket", True) in seen, seen
