"""Several sites, one control plane: two real daemons, one real Mosquitto, one real Home Assistant.

The pump house (site A) asks the greenhouse (site B) to run farm actions by naming `site` in its main group's
request. Each action here increments `input_number.irrigation_duration_raw` in Home Assistant, so HA itself
counts how often it ran: after duplicates from QoS 1 redelivery, a broker killed mid-traffic, the greenhouse
down through several resends and the pump house killed while it waited, every request is answered and each ran
exactly once. The daemons resend every second (FARMHOST_SITE_RESEND_SECONDS; 10 s by default), so a downtime of
several resends takes seconds, and wait half a second past a call's deadline for its answer
(FARMHOST_SITE_ANSWER_GRACE_SECONDS; 5 s by default).
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farm_daemon import audit, db_rows
from farmhost_testing import Daemon, clean_env, drop, ok, read_result, refused, scaled, wait_for, wait_result
from ha_fixture import HaInstance
from mosquitto import Mosquitto
from mqtt_support import Watcher, watching

pytestmark = pytest.mark.slow  # two daemons and a broker, seconds each

A = "pumphouse"
B = "greenhouse"
COUNTER = "input_number.irrigation_duration_raw"
INCREMENT = {"domain": "input_number", "service": "increment", "target": {"entity_id": COUNTER}}
RESEND_SECONDS = 1
# The origin's wait past a call's deadline (5 s by default): the deadline tests answer 3 s after the call, not 8 s.
ANSWER_GRACE_SECONDS = 0.5


@dataclass
class Sites:
    """The two daemons, their data dirs, the broker and Home Assistant."""

    a_dir: Path
    b_dir: Path
    a: Daemon
    b: Daemon
    broker: Mosquitto
    ha: HaInstance

    def count(self) -> int:
        return round(float(self.ha.get_state(COUNTER)["state"]))


def _daemon(data_dir: Path, ha_env: dict[str, str], broker: Mosquitto, site: str) -> Daemon:
    other = B if site == A else A  # each site serves the other's calls
    env = clean_env(
        **ha_env,
        FARMHOST_MQTT_URL=broker.url(),
        FARMHOST_SITE=site,
        FARMHOST_SITES_TRUSTED=other,
        FARMHOST_SITE_RESEND_SECONDS=str(RESEND_SECONDS),
        FARMHOST_SITE_ANSWER_GRACE_SECONDS=str(ANSWER_GRACE_SECONDS),
    )
    return Daemon(data_dir, env=env)


def _online(broker: Mosquitto, *sites: str) -> None:
    """Wait until the broker holds `online` for each site (its retained availability)."""
    watcher = Watcher(broker.port, *(f"farmhost/{s}/availability" for s in sites))
    try:
        for site in sites:
            watcher.wait(f"farmhost/{site}/availability", where=lambda m: m.payload == "online", timeout=30)
    finally:
        watcher.close()


@pytest.fixture
def sites(tmp_path: Path, data_dir_template: Path, ha: HaInstance, ha_env: dict[str, str]) -> Iterator[Sites]:
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root).start()
    a_dir, b_dir = tmp_path / "a" / "data", tmp_path / "b" / "data"
    for target in (a_dir, b_dir):
        target.parent.mkdir()
        shutil.copytree(data_dir_template, target)
    ha.set_number(COUNTER, 0)
    found = Sites(
        a_dir=a_dir,
        b_dir=b_dir,
        a=_daemon(a_dir, ha_env, broker, A).start(timeout=30),
        b=_daemon(b_dir, ha_env, broker, B).start(timeout=30),
        broker=broker,
        ha=ha,
    )
    try:
        _online(broker, A, B)
        yield found
        for daemon in (found.a, found.b):
            assert "Traceback" not in daemon.log(), daemon.log()[-3000:]
    finally:
        for daemon in (found.a, found.b):
            if daemon.proc is not None:
                daemon.stop()
        broker.kill()


def _ask(data_dir: Path, rid: str, *, site: str | None = B, folder: str = "main", **extra: Any) -> None:
    request: dict[str, Any] = {"type": "farm_action", "requestId": rid, "action": "ha_call_service", **extra}
    request.setdefault("params", INCREMENT)
    if site is not None:
        request["site"] = site
    drop(data_dir, folder, "actions", request)


def _soon() -> str:
    """A deadline as a site gives one: minutes away (a target refuses one further than 600 s)."""
    return (datetime.now(UTC) + timedelta(seconds=300)).isoformat()


def _calls_run_at(data_dir: Path, origin: str = A) -> list[str]:
    """The request ids of the calls a site ran for `origin` (its audit: one line per execution).

    A call refused (expired, not a farm action, one to pass on) is audited too (SPEC: every farm action, accepted
    or refused), but ran nothing.
    """
    refusals = {"expired", "invalid_request", "not_allowed"}
    ran = [line for line in audit(data_dir) if line["errorCode"] not in refusals]
    return [line["requestId"] for line in ran if line["requestId"].startswith(f"{origin}.")]


def _results(data_dir: Path, rids: list[str], timeout: float) -> list[dict[str, Any]]:
    def every_result() -> list[dict[str, Any]] | None:
        found = [read_result(data_dir, "main", rid) for rid in rids]
        return [r for r in found if r is not None] if all(r is not None for r in found) else None

    results: list[dict[str, Any]] = wait_for(
        every_result,
        timeout=timeout,
        what=f"the results of {len(rids)} requests",
        seen=lambda: [rid for rid in rids if read_result(data_dir, "main", rid) is None],
    )
    return results


def test_a_farm_action_for_another_site_runs_there_once_and_its_result_comes_home(sites: Sites) -> None:
    with watching(sites.broker.port, f"farmhost/{B}/rpc/+/request", f"farmhost/{A}/rpc/+/answer") as wire:
        _ask(sites.a_dir, "water-1")
        result = wait_result(sites.a_dir, "main", "water-1", timeout=30)
        (sent,) = wire.wait(f"farmhost/{B}/rpc/{A}/request")
        answers = wire.wait(f"farmhost/{A}/rpc/{B}/answer")

        changed = ok(result)
        assert result["requestId"] == "water-1" and result["action"] == "ha_call_service"
        assert changed["service"] == "input_number.increment", changed
        assert sites.count() == 1
        call = json.loads(sent.payload)
        assert call["request"]["requestId"] == "water-1" and "site" not in call["request"]
        assert json.loads(answers[0].payload)["id"] == call["id"]
        # each site audits its side: the origin names the site, the target the origin's call
        (at_a,) = audit(sites.a_dir, "water-1")
        assert at_a["site"] == B and at_a["status"] == "success"
        assert _calls_run_at(sites.b_dir) == [f"{A}.{call['id']}"]

        # QoS 1 delivers a message again when an acknowledgement is lost: the greenhouse answers again, runs once
        wire.publish(f"farmhost/{B}/rpc/{A}/request", sent.payload)
        wire.publish(f"farmhost/{B}/rpc/{A}/request", sent.payload)
        # (two answers given before the first went out go out once)
        again = wire.wait(f"farmhost/{A}/rpc/{B}/answer", len(answers) + 1)
        assert {json.loads(m.payload)["result"]["status"] for m in again} == {"success"}
        assert sites.count() == 1 and len(_calls_run_at(sites.b_dir)) == 1
        wait_for(
            lambda: "not run again" in sites.b.log(), timeout=10, what="the greenhouse to say it replayed the call"
        )

    # the same request id at the pump house is its own ledger's replay: nothing is sent again
    _ask(sites.a_dir, "water-1")
    _ask(sites.a_dir, "status-1", action="ha_get_status", params={"entityIds": [COUNTER]})
    status = ok(wait_result(sites.a_dir, "main", "status-1", timeout=30))
    assert [s["entity_id"] for s in status["states"]] == [COUNTER] and status["states"][0]["state"] == "1.0"
    assert sites.count() == 1 and len(audit(sites.a_dir, "water-1")) == 1
    rows = db_rows(sites.a_dir, "SELECT request_id, status, target FROM site_calls ORDER BY created_at")
    assert rows == [
        {"request_id": "water-1", "status": "answered", "target": B},
        {"request_id": "status-1", "status": "answered", "target": B},
    ]


def test_a_request_no_site_can_run_gets_a_definite_answer_and_changes_nothing(sites: Sites) -> None:
    _ask(sites.a_dir, "nowhere", site="barn")
    refused(wait_result(sites.a_dir, "main", "nowhere", timeout=30), "not_found", "barn", f"{B} (online)")
    _ask(sites.a_dir, "from-field", folder="field")
    refused(wait_result(sites.a_dir, "field", "from-field", timeout=30), "unauthorized", "main group")
    _ask(sites.a_dir, "bad-name", site="Green/house")
    refused(wait_result(sites.a_dir, "main", "bad-name", timeout=30), "invalid_request", "site")
    # its own name is no other site: it runs here, without MQTT
    _ask(sites.a_dir, "here", site=A, action="ha_get_status", params={"entityIds": [COUNTER]})
    ok(wait_result(sites.a_dir, "main", "here", timeout=30))
    assert "site" not in audit(sites.a_dir, "here")[0]
    assert sites.count() == 0 and _calls_run_at(sites.b_dir) == []


def test_a_request_for_another_site_refused_before_it_is_sent_is_audited_at_the_origin(sites: Sites) -> None:
    # Expired on arrival: the router answers it before the site row runs, so nothing goes on the wire; the pump
    # house still writes its audit line, naming the site, as for a farm action of its own.
    _ask(sites.a_dir, "stale", expiresAt="2020-01-01T00:00:00Z")
    refused(wait_result(sites.a_dir, "main", "stale", timeout=30), "expired")
    (line,) = audit(sites.a_dir, "stale")
    assert (line["group"], line["action"], line["site"]) == ("main", "ha_call_service", B), line
    assert (line["status"], line["errorCode"], line["params"]) == ("error", "expired", INCREMENT), line
    assert db_rows(sites.a_dir, "SELECT id FROM site_calls") == [] and _calls_run_at(sites.b_dir) == []
    assert sites.count() == 0


def test_hostile_messages_on_the_call_topics_are_answered_or_dropped_and_change_nothing(sites: Sites) -> None:
    topic = f"farmhost/{B}/rpc/{A}/request"
    deadline = _soon()
    with watching(sites.broker.port, f"farmhost/{A}/rpc/+/answer", f"farmhost/{B}/rpc/+/answer") as wire:
        wire.publish(topic, "not json {")
        wire.publish(topic, json.dumps([1, 2]))
        wire.publish(topic, json.dumps({"v": 1, "id": "a" * 32, "deadline": deadline, "request": {"type": "ping"}}))
        passed_on = {"type": "farm_action", "action": "ha_call_service", "params": INCREMENT, "site": "barn"}
        wire.publish(topic, json.dumps({"v": 1, "id": "b" * 32, "deadline": deadline, "request": passed_on}))
        extra = {"v": 1, "id": "c" * 32, "deadline": deadline, "request": {}, "sudo": True}
        wire.publish(topic, json.dumps(extra))
        # a site answering for the greenhouse, and a site calling itself the greenhouse
        wire.publish(f"farmhost/{B}/rpc/{B}/request", json.dumps({"v": 1, "id": "d" * 32}))
        answers = wire.wait(f"farmhost/{A}/rpc/{B}/answer", 3)
        errors = {json.loads(m.payload)["id"][0]: json.loads(m.payload)["result"] for m in answers}
        assert errors["a"]["errorCode"] == "invalid_request" and "type" in errors["a"]["error"]
        assert errors["b"]["errorCode"] == "not_allowed" and "passed on" in errors["b"]["error"]
        assert errors["c"]["errorCode"] == "invalid_request" and "sudo" in errors["c"]["error"]
        assert wire.on(f"farmhost/{B}/rpc/{B}/answer") == []
        refused_here = {line["requestId"]: line["errorCode"] for line in audit(sites.b_dir)}
        assert refused_here == {
            f"{A}.{'a' * 32}": "invalid_request",
            f"{A}.{'b' * 32}": "not_allowed",
            f"{A}.{'c' * 32}": "invalid_request",
        }, refused_here

    # while the greenhouse is away, a third site answers the pump house's call: that answer is not taken
    sites.b.stop()
    with watching(sites.broker.port, f"farmhost/{B}/rpc/+/request") as wire:
        _ask(sites.a_dir, "real")
        call = json.loads(wire.wait(f"farmhost/{B}/rpc/{A}/request")[-1].payload)
        forged = {"v": 1, "id": call["id"], "result": {"status": "error", "error": "forged", "errorCode": "internal"}}
        wire.publish(f"farmhost/{A}/rpc/barn/answer", json.dumps(forged))
        wire.publish(f"farmhost/{A}/rpc/{B}/answer", json.dumps({"v": 1, "id": call["id"], "result": "no"}))
        wait_for(lambda: "it was not asked" in sites.a.log(), timeout=10, what="the pump house to drop the forgery")
        wait_for(lambda: "bad answer" in sites.a.log(), timeout=10, what="the pump house to drop the bad answer")
        assert read_result(sites.a_dir, "main", "real") is None
    sites.b.start(timeout=30)
    ok(wait_result(sites.a_dir, "main", "real", timeout=60))
    assert sites.count() == 1 and len(_calls_run_at(sites.b_dir)) == 1
    assert "bad call from pumphouse" in sites.b.log()


def test_the_broker_killed_mid_traffic_loses_nothing_and_runs_nothing_twice(sites: Sites) -> None:
    rids = [f"burst-{i}" for i in range(12)]
    for rid in rids:
        _ask(sites.a_dir, rid)
    wait_for(
        lambda: sum(read_result(sites.a_dir, "main", r) is not None for r in rids) >= 3,
        timeout=scaled(30),
        what="the first answers",
    )
    sites.broker.kill()
    time.sleep(1.0)  # the scenario: the broker is away for a moment while calls are in flight
    sites.broker.start()

    results = _results(sites.a_dir, rids, timeout=90)
    assert [r["status"] for r in results] == ["success"] * len(rids), results
    assert sites.count() == len(rids)
    ran = _calls_run_at(sites.b_dir)
    assert len(ran) == len(set(ran)) == len(rids)


def _sends(data_dir: Path) -> dict[str, int]:
    """How often each pending call was handed to the broker."""
    return {
        row["id"]: row["sends"]
        for row in db_rows(data_dir, "SELECT id, sends FROM site_calls WHERE status = 'pending'")
    }


def test_a_site_down_through_several_resends_gets_its_calls_when_back_and_runs_each_once(sites: Sites) -> None:
    sites.b.stop(signal.SIGKILL)  # a power cut at the greenhouse: its last will says offline
    _online_or_not = Watcher(sites.broker.port, f"farmhost/{B}/availability")
    try:
        _online_or_not.wait(f"farmhost/{B}/availability", where=lambda m: m.payload == "offline", timeout=30)
    finally:
        _online_or_not.close()
    rids = ["while-down-1", "while-down-2", "while-down-3"]
    for rid in rids:
        _ask(sites.a_dir, rid)
    wait_for(
        lambda: len(db_rows(sites.a_dir, "SELECT id FROM site_calls WHERE status = 'pending'")) == 3,
        timeout=30,
        what="three calls queued at the pump house",
    )
    # the pump house crashes too while it waits, and comes back: its queue is in its database
    sites.a.stop(signal.SIGKILL)
    sites.a.start(timeout=30)
    # the calls wait in the background: the main group's queue answers everything else meanwhile
    drop(sites.a_dir, "main", "actions", {"type": "ping", "requestId": "meanwhile"})
    ok(wait_result(sites.a_dir, "main", "meanwhile", timeout=20))
    # the scenario: the greenhouse stays down while every call is sent three more times (30 s at the default 10 s)
    before = _sends(sites.a_dir)
    wait_for(
        lambda: len(now := _sends(sites.a_dir)) == 3 and all(now[c] >= before.get(c, 0) + 3 for c in now),
        timeout=10 * RESEND_SECONDS,
        what="three more sends of each waiting call",
        seen=lambda: (before, _sends(sites.a_dir)),
    )
    assert [read_result(sites.a_dir, "main", r) for r in rids] == [None] * 3  # waiting, not given up
    assert sites.count() == 0

    sites.b.start(timeout=30)
    results = _results(sites.a_dir, rids, timeout=60)
    assert [r["status"] for r in results] == ["success"] * 3, results
    assert sites.count() == 3
    ran = _calls_run_at(sites.b_dir)
    assert len(ran) == len(set(ran)) == 3


def test_a_call_past_its_deadline_is_answered_and_never_runs_later(sites: Sites) -> None:
    sites.b.stop(signal.SIGKILL)
    _ask(sites.a_dir, "too-late", ttl=3)
    result = wait_result(sites.a_dir, "main", "too-late", timeout=40)
    refused(result, "upstream_unavailable", f"site {B} is offline", "did not run")

    sites.b.start(timeout=30)  # the call waited for it at the broker: the greenhouse refuses it now
    wait_for(lambda: "expired" in sites.b.log(), timeout=30, what="the greenhouse to refuse the expired call")
    assert sites.count() == 0 and _calls_run_at(sites.b_dir) == []
    (row,) = db_rows(sites.a_dir, "SELECT status FROM site_calls")
    assert row["status"] == "gave_up"


def test_a_flood_of_calls_keeps_the_target_answering_and_its_memory_bounded(sites: Sites) -> None:
    topic = f"farmhost/{B}/rpc/{A}/request"
    status = {"type": "farm_action", "action": "ha_get_status", "params": {"entityIds": [COUNTER]}}
    deadline = _soon()
    with watching(sites.broker.port, f"farmhost/{A}/rpc/+/answer") as wire:
        for n in range(400):
            call = {"v": 1, "id": f"{n:032x}", "deadline": deadline, "request": status}
            wire.client.publish(topic, json.dumps(call), qos=1)
        # meanwhile the greenhouse's own groups are answered
        drop(sites.b_dir, "main", "actions", {"type": "ping", "requestId": "during-flood"})
        ok(wait_result(sites.b_dir, "main", "during-flood", timeout=20))
        wait_for(
            lambda: len(wire.on(f"farmhost/{A}/rpc/{B}/answer")) + sites.b.log().count("dropped a call") >= 400,
            timeout=120,
            what="every call answered or dropped",
        )
    answers = wire.on(f"farmhost/{A}/rpc/{B}/answer")
    assert {json.loads(m.payload)["result"]["status"] for m in answers} == {"success"}
    assert sites.count() == 0 and sites.b.proc is not None and sites.b.proc.poll() is None


def test_a_site_that_is_online_but_silent_is_answered_timeout_and_refuses_the_call_later(sites: Sites) -> None:
    assert sites.b.proc is not None
    sites.b.proc.send_signal(signal.SIGSTOP)  # frozen: its connection (and `online`) lasts until the keepalive ends
    try:
        _ask(sites.a_dir, "silent", ttl=3)
        result = wait_result(sites.a_dir, "main", "silent", timeout=40)
    finally:
        sites.b.proc.send_signal(signal.SIGCONT)
    refused(result, "timeout", f"site {B} did not answer", "check its state")
    wait_for(lambda: "expired" in sites.b.log(), timeout=30, what="the greenhouse to refuse the late call")
    assert sites.count() == 0 and _calls_run_at(sites.b_dir) == []
