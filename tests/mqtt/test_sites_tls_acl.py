"""Sites that log in by TLS client certificate, under the ACL file of docs/mqtt.md, on a real Mosquitto.

The broker takes each client's certificate common name as its user and applies `SITE_ACL` (the docs' file, word
for word). The CA signs more than the sites: a third host (`barn`, no block in the ACL), a device and Home
Assistant log in with valid certificates, yet none of them can publish a call, in its own name or the pump
house's (the broker drops it), and the barn cannot read the answers meant for the pump house: a signature says
"may log in", not "may run farm actions" (why FARMHOST_SITES_TRUSTED is an explicit list). Neither daemon has
Home Assistant: the greenhouse answers `upstream_unavailable`, which proves the call ran there.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from farm_daemon import db_rows
from farmhost_testing import Daemon, clean_env, drop, farmhost, refused, wait_for, wait_result
from mosquitto import SITE_ACL, Certificates, Mosquitto
from mqtt_support import Watcher

pytestmark = pytest.mark.slow

A, B, ROGUE = "pumphouse", "greenhouse", "barn"
OTHERS = (ROGUE, "tasmota1", "homeassistant")  # certificates the CA signed for a host, a device and HA


@dataclass
class Tls:
    certs: Certificates
    broker: Mosquitto
    a_dir: Path
    b_dir: Path

    def env(self, site: str, **extra: str) -> dict[str, str]:
        cert, key = self.certs.clients[site]
        settings = {
            "FARMHOST_MQTT_URL": self.broker.url(),
            "FARMHOST_SITE": site,
            "FARMHOST_SITES_TRUSTED": A if site == B else B,
            "FARMHOST_MQTT_CA_FILE": str(self.certs.ca),
            "FARMHOST_MQTT_CERT_FILE": str(cert),
            "FARMHOST_MQTT_KEY_FILE": str(key),
        }
        return clean_env(**{**settings, **extra})

    def watcher(self, site: str, *topics: str) -> Watcher:
        cert, key = self.certs.clients[site]
        return Watcher(self.broker.port, *topics, tls=(self.certs.ca, cert, key), client_id=site)


@pytest.fixture
def tls(tmp_path: Path, data_dir_template: Path) -> Iterator[Tls]:
    certs = Certificates(tmp_path / "certs", (A, B, *OTHERS))
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root, tls=certs, acl=SITE_ACL, log_denied=True).start()
    dirs = []
    for site in (A, B):
        target = tmp_path / site / "data"
        target.parent.mkdir()
        shutil.copytree(data_dir_template, target)
        dirs.append(target)
    try:
        yield Tls(certs=certs, broker=broker, a_dir=dirs[0], b_dir=dirs[1])
    finally:
        broker.kill()


def _ledger_ids(data_dir: Path) -> list[str]:
    return [r["request_id"] for r in db_rows(data_dir, "SELECT request_id FROM request_ledger WHERE folder = 'main'")]


def test_sites_log_in_by_certificate_and_the_acl_keeps_each_to_its_own_name(tls: Tls) -> None:
    a = Daemon(tls.a_dir, env=tls.env(A)).start(timeout=30)
    b = Daemon(tls.b_dir, env=tls.env(B)).start(timeout=30)
    rogue = tls.watcher(ROGUE, f"farmhost/{A}/rpc/+/answer")
    sites = tls.watcher(A, "farmhost/+/availability")
    try:
        for site in (A, B):
            sites.wait(f"farmhost/{site}/availability", where=lambda m: m.payload == "online", timeout=30)

        drop(tls.a_dir, "main", "actions", {"type": "farm_action", "requestId": "tls-1", "action": "ha_get_status",
                                            "site": B})  # fmt: skip
        refused(wait_result(tls.a_dir, "main", "tls-1", timeout=30), "upstream_unavailable", f"site {B}:")
        (ran,) = _ledger_ids(tls.b_dir)
        assert ran.startswith(f"{A}.")

        # the barn, the device and Home Assistant call in their own names and in the pump house's: all dropped
        forged = {"type": "farm_action", "action": "ha_get_status", "requestId": "x"}
        deadline = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
        others = [rogue] + [tls.watcher(name) for name in OTHERS[1:]]
        try:
            for name, login in zip(OTHERS, others, strict=True):
                for origin in (name, A):
                    call = {"v": 1, "id": uuid.uuid4().hex, "deadline": deadline, "request": forged}
                    login.publish(f"farmhost/{B}/rpc/{origin}/request", json.dumps(call))
            for name in OTHERS:
                wait_for(
                    lambda name=name: tls.broker.log().count(f"Denied PUBLISH from {name} ") == 2,  # type: ignore[misc]
                    timeout=10,
                    what=f"the broker to deny both calls of {name}",
                    seen=lambda: tls.broker.log()[-2000:],
                )
        finally:
            for login in others[1:]:
                login.close()
        assert _ledger_ids(tls.b_dir) == [ran] and "not served" not in b.log()
        assert rogue.on(f"farmhost/{A}/rpc/{B}/answer") == []  # the pump house's answers are not the barn's to read

        doctor = farmhost("doctor", data_dir=tls.a_dir, env=tls.env(A))
        assert f"mqtts://127.0.0.1:{tls.broker.port}, site {A}" in doctor.stdout, doctor.stdout
        for daemon in (a, b):
            assert "Traceback" not in daemon.log()
    finally:
        rogue.close()
        sites.close()
        for daemon in (a, b):
            if daemon.proc is not None:
                daemon.stop()


def test_unreadable_tls_files_are_named_by_doctor_and_the_daemon(tls: Tls) -> None:
    missing = tls.env(A, FARMHOST_MQTT_KEY_FILE=str(tls.a_dir / "nope.key"))
    doctor = farmhost("doctor", data_dir=tls.a_dir, env=missing)
    assert "cannot use the MQTT TLS files" in doctor.stdout and "FARMHOST_MQTT_KEY_FILE" in doctor.stdout
    half = clean_env(FARMHOST_MQTT_URL=tls.broker.url(), FARMHOST_MQTT_CERT_FILE=str(tls.certs.ca))
    run = farmhost("run", data_dir=tls.a_dir, env=half, timeout=30)
    assert run.returncode != 0 and "FARMHOST_MQTT_CERT_FILE and FARMHOST_MQTT_KEY_FILE go together" in run.stderr
    plain = clean_env(FARMHOST_MQTT_URL="mqtt://127.0.0.1:1883", FARMHOST_MQTT_CA_FILE=str(tls.certs.ca))
    run = farmhost("run", data_dir=tls.a_dir, env=plain, timeout=30)
    assert run.returncode != 0 and "must start with mqtts://" in run.stderr
