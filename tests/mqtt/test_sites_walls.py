"""Calls only from sites: a real daemon, a real Mosquitto and the real Home Assistant's irrigation pump.

The greenhouse (site B) trusts the pump house (site A) and nobody else. Under the broker of docs/mqtt.md (its
password file and its ACL file, read from the docs) a device login and Home Assistant's login cannot publish a
call at all; on a broker that lets everything through, the greenhouse itself serves only the pump house and
answers nobody else. A retained call, a call whose deadline is years away and a call past its deadline never run.
Every call here would switch the pump on, so HA's own state says whether one ran.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit, db_rows
from farmhost_testing import Daemon, clean_env, farmhost, wait_for
from ha_fixture import HaInstance
from mosquitto import SITE_ACL, Mosquitto
from mqtt_support import Seen, Watcher

pytestmark = pytest.mark.slow  # a daemon, a broker and HA

A, B = "pumphouse", "greenhouse"  # the site logins of docs/mqtt.md's ACL
DEVICE, HA_LOGIN = "tasmota1", "homeassistant"  # its device and Home Assistant logins
PASSWORDS = {A: "pw-a", B: "pw-b", DEVICE: "pw-device", HA_LOGIN: "pw-ha"}
PUMP = "switch.irrigation_pump"
PUMP_ON = {
    "type": "farm_action",
    "action": "ha_call_service",
    "params": {"domain": "switch", "service": "turn_on", "target": {"entity_id": PUMP}},
}
STATUS = {"type": "farm_action", "action": "ha_get_status", "params": {"entityIds": [PUMP]}}


def _call(request: dict[str, Any], *, deadline: datetime | None = None) -> tuple[str, str]:
    """(call id, the call's JSON) as a site sends it; the deadline 60 s away unless given."""
    call_id = uuid.uuid4().hex
    when = deadline or datetime.now(UTC) + timedelta(seconds=60)
    return call_id, json.dumps({"v": 1, "id": call_id, "deadline": when.isoformat(), "request": request})


def _request_topic(origin: str) -> str:
    return f"farmhost/{B}/rpc/{origin}/request"


def _answer(watcher: Watcher, origin: str, call_id: str) -> dict[str, Any]:
    """The greenhouse's result document for `call_id`, once it is on `origin`'s answer topic."""

    def answered(m: Seen) -> bool:
        return bool(m.json()["id"] == call_id)

    topic = f"farmhost/{origin}/rpc/{B}/answer"
    wait_for(lambda: any(answered(m) for m in watcher.on(topic)), timeout=30, what=f"the answer to {call_id}")
    result: dict[str, Any] = next(m for m in watcher.on(topic) if answered(m)).json()["result"]
    return result


def _online(watcher: Watcher) -> None:
    """Wait until the greenhouse says `online`: it has subscribed to its calls by then."""
    watcher.wait(f"farmhost/{B}/availability", where=lambda m: m.payload == "online", timeout=30)


def _answers(watcher: Watcher) -> list[Seen]:
    return [m for m in watcher.seen if "/rpc/" in m.topic]


def _ledger(data_dir: Path) -> list[str]:
    return [r["request_id"] for r in db_rows(data_dir, "SELECT request_id FROM request_ledger")]


def _pump(ha: HaInstance) -> str:
    return str(ha.get_state(PUMP)["state"])


@pytest.fixture
def b_dir(tmp_path: Path, data_dir_template: Path) -> Path:
    target = tmp_path / B / "data"
    target.parent.mkdir()
    shutil.copytree(data_dir_template, target)
    return target


@pytest.fixture
def pump_off(ha_reset: HaInstance) -> Iterator[HaInstance]:
    """The session's HA with the pump off, and off again after the test."""
    ha_reset.call_service("switch", "turn_off", {"entity_id": PUMP})
    wait_for(lambda: _pump(ha_reset) == "off", timeout=10, what="the pump off before the test")
    yield ha_reset
    ha_reset.call_service("switch", "turn_off", {"entity_id": PUMP})


def _greenhouse(b_dir: Path, ha_env: dict[str, str], url: str, **extra: str) -> Daemon:
    return Daemon(b_dir, env=clean_env(**ha_env, FARMHOST_MQTT_URL=url, FARMHOST_SITE=B, **extra))


def test_under_the_documented_acl_a_device_and_home_assistant_cannot_call_a_site(
    tmp_path: Path, b_dir: Path, pump_off: HaInstance, ha_env: dict[str, str]
) -> None:
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root, users=PASSWORDS, acl=SITE_ACL, log_denied=True).start()
    site_a = Watcher(broker.port, f"farmhost/{A}/rpc/+/answer", user=A, password=PASSWORDS[A], client_id=A)
    logins = {u: Watcher(broker.port, user=u, password=PASSWORDS[u], client_id=u) for u in (DEVICE, HA_LOGIN)}
    daemon = _greenhouse(b_dir, ha_env, broker.url(B, PASSWORDS[B]), FARMHOST_SITES_TRUSTED=A)
    try:
        # a retained call waits at the broker for the greenhouse's first subscription: refused, never run
        retained_id, retained = _call(PUMP_ON)
        site_a.client.publish(_request_topic(A), retained, qos=1, retain=True).wait_for_publish(timeout=10)
        daemon.start(timeout=30)
        answer = _answer(site_a, A, retained_id)
        assert answer["errorCode"] == "invalid_request" and "retained call is not run" in answer["error"], answer
        assert f"refused call {retained_id} from {A}" in daemon.log()

        # the device and Home Assistant call in their own names and in the pump house's: the broker drops all four
        for name, login in logins.items():
            for origin in (name, A):
                login.publish(_request_topic(origin), _call(PUMP_ON)[1])
        for name in (DEVICE, HA_LOGIN):
            wait_for(
                lambda name=name: broker.log().count(f"Denied PUBLISH from {name} ") == 2,  # type: ignore[misc]
                timeout=10,
                what=f"the broker to deny both calls of {name}",
                seen=lambda: broker.log()[-2000:],
            )

        # the pump house's own calls: one whose deadline is in 2095, one past its deadline, then a status
        far_id, far = _call(PUMP_ON, deadline=datetime(2095, 1, 1, tzinfo=UTC))
        late_id, late = _call(PUMP_ON, deadline=datetime.now(UTC) - timedelta(seconds=1))
        status_id, status = _call(STATUS)
        for text in (far, late, status):
            site_a.publish(_request_topic(A), text)
        answer = _answer(site_a, A, far_id)
        assert answer["errorCode"] == "invalid_request" and "2095-01-01" in answer["error"], answer
        assert "at most 600 s" in answer["error"], answer
        assert _answer(site_a, A, late_id)["errorCode"] == "expired"
        assert _answer(site_a, A, status_id)["status"] == "success"

        assert _pump(pump_off) == "off"
        # the pump calls audited are the pump house's three, each refused (audited as every refused farm action)
        calls = {line["requestId"]: line["errorCode"] for line in audit(b_dir) if line["action"] == "ha_call_service"}
        refusals = {retained_id: "invalid_request", far_id: "invalid_request", late_id: "expired"}
        assert calls == {f"{A}.{call_id}": code for call_id, code in refusals.items()}, calls
        assert all(rid.startswith(f"{A}.") for rid in _ledger(b_dir)), _ledger(b_dir)
        assert "not served" not in daemon.log()  # the greenhouse never even saw their calls

        # the same call from the pump house, sent as a site sends it, does run: the wall is the origin, not the act
        run_id, run = _call(PUMP_ON)
        site_a.publish(_request_topic(A), run)
        assert _answer(site_a, A, run_id)["status"] == "success"
        wait_for(lambda: _pump(pump_off) == "on", timeout=10, what="the pump on")
        assert "Traceback" not in daemon.log()
    finally:
        for watcher in (site_a, *logins.values()):
            watcher.close()
        if daemon.proc is not None:
            daemon.stop()
        broker.kill()


def test_a_site_serves_only_the_sites_it_trusts_whatever_the_broker_lets_through(
    tmp_path: Path, b_dir: Path, pump_off: HaInstance, ha_env: dict[str, str]
) -> None:
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root).start()  # anonymous, no ACL: anyone may publish as any origin
    daemon = _greenhouse(b_dir, ha_env, broker.url(), FARMHOST_SITES_TRUSTED=A).start(timeout=30)
    wire = Watcher(broker.port, f"farmhost/+/rpc/{B}/answer", f"farmhost/{B}/availability")
    try:
        _online(wire)
        untrusted = (DEVICE, DEVICE, HA_LOGIN, HA_LOGIN, "barn", "barn", "Not-A-Site")
        for origin in untrusted:
            wire.publish(_request_topic(origin), _call(PUMP_ON)[1])
        status_id, status = _call(STATUS)
        wire.publish(_request_topic(A), status)  # handled after every call above: the greenhouse reads in order
        assert _answer(wire, A, status_id)["status"] == "success"

        log = daemon.log()
        for origin in (DEVICE, HA_LOGIN, "barn"):
            assert log.count(f"calls from {origin!r} are not served and not answered") == 1, log[-3000:]
        assert log.count("calls from 'farmhost/greenhouse/rpc/Not-A-Site/request' are not served") == 1
        assert f"FARMHOST_SITES_TRUSTED: {A}" in log
        answered = {m.topic for m in _answers(wire)}
        assert answered == {f"farmhost/{A}/rpc/{B}/answer"}, answered
        assert _pump(pump_off) == "off"
        assert _ledger(b_dir) == [f"{A}.{status_id}"]
        assert [line["requestId"] for line in audit(b_dir)] == [f"{A}.{status_id}"]

        doctor = farmhost("doctor", data_dir=b_dir, env=daemon.env)
        assert f"site {B}; serves the calls of {A}" in doctor.stdout, doctor.stdout
    finally:
        wire.close()
        daemon.stop()
        broker.kill()


def test_a_site_serves_no_other_site_until_it_is_told_whom_to_trust(
    tmp_path: Path, b_dir: Path, pump_off: HaInstance, ha_env: dict[str, str]
) -> None:
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root).start()
    bad = farmhost("run", data_dir=b_dir, env=clean_env(FARMHOST_SITES_TRUSTED="pumphouse,Green/house"), timeout=30)
    assert bad.returncode != 0 and "FARMHOST_SITES_TRUSTED" in bad.stderr, bad.stderr
    assert "'Green/house' is not a site name" in bad.stderr, bad.stderr

    daemon = _greenhouse(b_dir, ha_env, broker.url()).start(timeout=30)
    wire = Watcher(broker.port, f"farmhost/+/rpc/{B}/answer", f"farmhost/{B}/availability")
    try:
        _online(wire)
        assert "serving no other site's calls (FARMHOST_SITES_TRUSTED names none)" in daemon.log()
        wire.publish(_request_topic(A), _call(PUMP_ON)[1])
        wait_for(
            lambda: f"calls from {A!r} are not served" in daemon.log(),
            timeout=20,
            what="the greenhouse to refuse the pump house",
        )
        assert "FARMHOST_SITES_TRUSTED: none" in daemon.log()
        assert _answers(wire) == [] and _ledger(b_dir) == [] and audit(b_dir) == []
        assert _pump(pump_off) == "off"
        doctor = farmhost("doctor", data_dir=b_dir, env=daemon.env)
        assert "serves no other site's calls (FARMHOST_SITES_TRUSTED)" in doctor.stdout, doctor.stdout
    finally:
        wire.close()
        daemon.stop()
        broker.kill()
