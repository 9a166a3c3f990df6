"""The target's side of a call it refuses: a real daemon (the greenhouse), a real Mosquitto, no Home Assistant.

The greenhouse trusts the pump house. Every call the pump house sends that the greenhouse refuses before running
it (retained, a deadline years away, not a farm action, one to pass on, a field too many) is answered with a
definite error and audited, as SPEC asks of every farm action, accepted or refused; a call Python cannot read
(a deadline past year 9999 in UTC, an integer of 5,000 digits) is refused with a reason, not a traceback. On a
broker without the ACL, an origin of 60,000 characters costs one short log line.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit
from farmhost_testing import Daemon, clean_env, wait_for
from mosquitto import Mosquitto
from mqtt_support import Seen, Watcher

pytestmark = pytest.mark.slow  # a daemon and a broker

A, B = "pumphouse", "greenhouse"
PUMP_ON = {
    "type": "farm_action",
    "action": "ha_call_service",
    "params": {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.irrigation_pump"}},
}
REQUEST_TOPIC = f"farmhost/{B}/rpc/{A}/request"
ANSWER_TOPIC = f"farmhost/{A}/rpc/{B}/answer"


def _call(request: Any, *, deadline: datetime | None = None, **extra: Any) -> tuple[str, str]:
    call_id = uuid.uuid4().hex
    when = deadline or datetime.now(UTC) + timedelta(seconds=60)
    return call_id, json.dumps({"v": 1, "id": call_id, "deadline": when.isoformat(), "request": request, **extra})


def _answer(wire: Watcher, call_id: str) -> dict[str, Any]:
    def mine(m: Seen) -> bool:
        return bool(m.json()["id"] == call_id)

    wait_for(lambda: any(mine(m) for m in wire.on(ANSWER_TOPIC)), timeout=30, what=f"the answer to {call_id}")
    result: dict[str, Any] = next(m for m in wire.on(ANSWER_TOPIC) if mine(m)).json()["result"]
    return result


@pytest.fixture
def greenhouse(tmp_path: Path, data_dir: Path) -> Iterator[tuple[Daemon, Watcher]]:
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root).start()
    env = clean_env(FARMHOST_MQTT_URL=broker.url(), FARMHOST_SITE=B, FARMHOST_SITES_TRUSTED=A)
    daemon = Daemon(data_dir, env=env)
    wire = Watcher(broker.port, ANSWER_TOPIC, f"farmhost/{B}/availability")
    try:
        yield daemon, wire
        assert "Traceback" not in daemon.log(), daemon.log()[-3000:]
    finally:
        wire.close()
        if daemon.proc is not None:
            daemon.stop()
        broker.kill()


def test_every_call_the_target_refuses_before_running_it_is_audited_there(
    greenhouse: tuple[Daemon, Watcher], data_dir: Path
) -> None:
    daemon, wire = greenhouse
    retained_id, retained = _call(PUMP_ON)
    wire.publish(REQUEST_TOPIC, retained, retain=True)  # waits at the broker for the greenhouse's subscription
    daemon.start(timeout=30)
    wire.wait(f"farmhost/{B}/availability", where=lambda m: m.payload == "online", timeout=30)
    wire.publish(REQUEST_TOPIC, "")  # the retained call is gone from the broker once it was handed on

    far_id, far = _call(PUMP_ON, deadline=datetime(2095, 1, 1, tzinfo=UTC))
    ping_id, ping = _call({"type": "ping"})
    passed_id, passed = _call({**PUMP_ON, "site": "barn"})
    extra_id, extra = _call(PUMP_ON, sudo=True)
    for text in (far, ping, passed, extra):
        wire.publish(REQUEST_TOPIC, text)
    expected = {
        retained_id: ("invalid_request", "ha_call_service"),
        far_id: ("invalid_request", "ha_call_service"),
        ping_id: ("invalid_request", None),
        passed_id: ("not_allowed", "ha_call_service"),
        extra_id: ("invalid_request", "ha_call_service"),
    }
    for call_id, (code, _) in expected.items():
        answer = _answer(wire, call_id)
        assert answer["status"] == "error" and answer["errorCode"] == code, answer
        assert answer["error"] and answer["requestId"] == f"{A}.{call_id}", answer

    def lines() -> dict[str, dict[str, Any]]:
        return {line["requestId"]: line for line in audit(data_dir)}

    wanted = {f"{A}.{call_id}" for call_id in expected}
    wait_for(lambda: wanted <= set(lines()), timeout=10, what="an audit line per refused call", seen=lines)
    for call_id, (code, action) in expected.items():
        line = lines()[f"{A}.{call_id}"]
        assert (line["group"], line["status"], line["errorCode"], line["action"]) == ("main", "error", code, action)
    assert lines()[f"{A}.{far_id}"]["params"] == PUMP_ON["params"]


def test_a_call_python_cannot_read_is_refused_with_a_reason_not_a_traceback(
    greenhouse: tuple[Daemon, Watcher], data_dir: Path
) -> None:
    daemon, wire = greenhouse
    daemon.start(timeout=30)
    wire.wait(f"farmhost/{B}/availability", where=lambda m: m.payload == "online", timeout=30)
    # a deadline no UTC clock can show (year 10000 in UTC), and one whose request holds an integer of 5000 digits
    # (past Python's limit for reading one)
    edge_id, edge = _call(PUMP_ON)
    edge = edge.replace(json.loads(edge)["deadline"], "9999-12-31T23:59:59-14:00")
    huge_id, huge = _call(PUMP_ON)
    huge = huge.replace('"turn_on"', '"turn_on", "n": ' + "1" * 5000)
    status_id, status = _call({"type": "farm_action", "action": "ha_get_status", "params": {}})
    for text in (edge, huge, status):
        wire.publish(REQUEST_TOPIC, text)
    answer = _answer(wire, edge_id)
    assert answer["errorCode"] == "invalid_request" and "deadline" in answer["error"], answer
    _answer(wire, status_id)  # answered after the two before it: the greenhouse reads its calls in order
    log = daemon.log()
    assert "4300 digits" in log and "Traceback" not in log, log[-3000:]
    assert [m for m in wire.on(ANSWER_TOPIC) if m.json()["id"] == huge_id] == []  # no id could be read
    assert {line["requestId"] for line in audit(data_dir)} >= {f"{A}.{edge_id}"}


def test_an_origin_that_is_no_site_name_is_logged_by_the_start_of_its_topic(
    greenhouse: tuple[Daemon, Watcher], data_dir: Path
) -> None:
    daemon, wire = greenhouse
    daemon.start(timeout=30)
    wire.wait(f"farmhost/{B}/availability", where=lambda m: m.payload == "online", timeout=30)
    # on a broker without the ACL: topic levels of 60,000 characters, each a new origin remembered and logged once
    for letter in "xyz":
        wire.publish(f"farmhost/{B}/rpc/{letter.upper() * 60_000}/request", _call(PUMP_ON)[1])
    status_id, status = _call({"type": "farm_action", "action": "ha_get_status", "params": {}})
    wire.publish(REQUEST_TOPIC, status)
    _answer(wire, status_id)  # answered after the three before it: the greenhouse reads its calls in order
    lines = [line for line in daemon.log().splitlines() if "are not served" in line]
    assert len(lines) == 3 and all(len(line) < 2000 for line in lines), [len(line) for line in lines]
    assert audit(data_dir) == [] or all(line["requestId"] == f"{A}.{status_id}" for line in audit(data_dir))
