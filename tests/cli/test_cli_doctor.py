"""`farmhost doctor`: every part ok / off / broken with the fix, against real local endpoints."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from farmhost_testing import Daemon, clean_env, farmhost, wait_for
from ha_fixture import HaInstance

PARTS = (
    "python",
    "data dir",
    "database",
    "groups",
    "live view",
    "disk",
    "inotify",
    "clock",
    "timezone",
    "home assistant",
    "telegram",
    "voice",
    "llm",
    "sandbox",
    "agent limits",
    "farm profile",
    "actuator rules",
    "guarded",
    "mqtt",
)
STATES = {"ok", "warn", "off", "broken"}
BOT_TOKEN = "123456:test-token-AAAAAAAAAAAAAAAAAAAAAAAAAAA"


class BotApi(ThreadingHTTPServer):
    """A tiny Bot API server: answers getMe for one token, 401 for any other."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _BotApiHandler)
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        """Root URL for TELEGRAM_API_BASE_URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"


class _BotApiHandler(BaseHTTPRequestHandler):
    server: BotApi

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if self.path == f"/bot{BOT_TOKEN}/getMe":
            status, body = 200, {"ok": True, "result": {"id": 123456, "is_bot": True, "username": "farm_bot"}}
        else:
            status, body = 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads `server.paths` instead."""


@pytest.fixture
def bot_api() -> Iterator[BotApi]:
    server = BotApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens here any more: connecting is refused at once


def _report(data_dir: Path, **env: str) -> tuple[int, dict[str, dict[str, str]]]:
    done = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(**env))
    assert "Traceback" not in done.stderr
    checks = json.loads(done.stdout)
    assert {c["part"] for c in checks} >= set(PARTS)
    for check in checks:
        assert set(check) == {"part", "state", "detail", "fix"}
        assert check["state"] in STATES
        assert check["detail"]
        if check["state"] != "ok":
            assert check["fix"], f"{check['part']} is {check['state']} without a fix"
    broken = any(c["state"] == "broken" for c in checks)
    assert done.returncode == (1 if broken else 0), done.stderr
    return done.returncode, {c["part"]: c for c in checks}


def test_doctor_on_a_healthy_data_dir(data_dir: Path) -> None:
    settings = {"FARMHOST_AGENT_RUNTIME": "process", "TZ": "Europe/Lisbon"}
    code, checks = _report(data_dir, **settings)
    assert list(checks) == list(PARTS), "the report's order is fixed"
    for part in ("python", "data dir", "database", "groups", "inotify", "sandbox", "timezone"):
        assert checks[part]["state"] == "ok", checks[part]
    assert checks["timezone"]["detail"].startswith("Europe/Lisbon (from TZ), local time")
    assert checks["clock"]["state"] in {"ok", "warn"} and "NTP" in checks["clock"]["detail"], checks["clock"]
    assert "main is 'main'" in checks["groups"]["detail"]
    assert "NO isolation" in checks["sandbox"]["detail"]
    for part, variable in (("home assistant", "HA_URL"), ("telegram", "TELEGRAM_BOT_TOKEN"), ("llm", "LLM")):
        assert checks[part]["state"] == "off" and variable in checks[part]["detail"], checks[part]
    assert checks["voice"]["state"] == "off" and checks["voice"]["detail"].startswith("voice notes: off")
    text = farmhost("doctor", data_dir=data_dir, env=clean_env(**settings))
    assert text.returncode == code
    lines = text.stdout.splitlines()
    for part, check in checks.items():
        line = next(line for line in lines if line.startswith(f"{part} "))
        assert line.split()[len(part.split())] == check["state"], line
    assert "fix: set HA_URL and HA_TOKEN" in text.stdout


def test_doctor_on_a_missing_data_dir_says_broken_and_how_to_fix_it(tmp_path: Path) -> None:
    missing = tmp_path / "data"
    code, checks = _report(missing)
    assert code == 1
    for part in ("data dir", "database"):
        assert checks[part]["state"] == "broken"
        assert checks[part]["fix"] == f"farmhost init --data-dir {missing}"
    assert "does not exist" in checks["data dir"]["detail"]
    assert checks["groups"]["state"] != "ok"
    # Not even the parent exists: still a report, not a traceback, and nothing is created.
    deep = tmp_path / "nowhere" / "data"
    text = subprocess.run(
        [sys.executable, "-m", "farmhost", "doctor", "--data-dir", str(deep)],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=60,
    )
    assert text.returncode == 1, text.stderr
    assert "Traceback" not in text.stderr
    assert f"fix: farmhost init --data-dir {deep}" in text.stdout
    disk = next(line for line in text.stdout.splitlines() if line.startswith("disk "))
    assert disk.split()[1] in STATES and "free" in disk
    assert not missing.exists() and not deep.parent.exists(), "doctor must not create anything"


def test_doctor_probes_home_assistant_and_telegram(tmp_path: Path, bot_api: BotApi) -> None:
    data_dir = tmp_path / "data"  # the probes need no data directory
    ha = f"http://127.0.0.1:{_closed_port()}"
    code, checks = _report(
        data_dir, HA_URL=ha, HA_TOKEN="ha-secret-token", TELEGRAM_BOT_TOKEN=BOT_TOKEN, TELEGRAM_API_BASE_URL=bot_api.url
    )
    assert code == 1
    assert checks["home assistant"]["state"] == "broken"
    assert "unreachable" in checks["home assistant"]["detail"]
    assert "HA_URL" in checks["home assistant"]["fix"]
    assert checks["telegram"]["state"] == "ok", checks["telegram"]
    assert bot_api.paths == [f"/bot{BOT_TOKEN}/getMe"]
    # A token the Bot API refuses is broken, and the token never appears in the report.
    done = farmhost(
        "doctor",
        data_dir=data_dir,
        env=clean_env(TELEGRAM_BOT_TOKEN="999:wrong-token-BBBBBBBBBBBBBBBBBBBBBB", TELEGRAM_API_BASE_URL=bot_api.url),
    )
    telegram = next(line for line in done.stdout.splitlines() if line.startswith("telegram "))
    assert telegram.split()[1] == "broken" and "401" in telegram
    assert "TELEGRAM_BOT_TOKEN" in done.stdout
    assert "wrong-token" not in done.stdout + done.stderr
    assert len(bot_api.paths) == 2


def test_doctor_reports_a_broken_farm_profile_and_the_production_gate(data_dir: Path) -> None:
    profile = data_dir / "farm-profile.json"
    profile.write_text("{not json")
    done = farmhost("doctor", "--json", data_dir=data_dir)
    line = next(c for c in json.loads(done.stdout) if c["part"] == "farm profile")
    assert done.returncode == 1
    assert line["state"] == "broken" and str(profile) in line["fix"]
    profile.unlink()
    production = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(FARM_MODE="production"))
    line = next(c for c in json.loads(production.stdout) if c["part"] == "farm profile")
    assert line["state"] == "broken", "production without a validated profile refuses control actions"
    demo = farmhost("doctor", "--json", data_dir=data_dir)
    assert next(c for c in json.loads(demo.stdout) if c["part"] == "farm profile")["state"] == "off"


def test_doctor_shows_the_actuator_rules_in_words(data_dir: Path) -> None:
    before = farmhost("doctor", "--json", data_dir=data_dir)
    line = next(c for c in json.loads(before.stdout) if c["part"] == "actuator rules")
    assert line["state"] == "off" and "policy.rules" in line["fix"]
    rules = [
        {"entities": ["switch.irrigation_pump"], "maxOnSeconds": 1800, "requireApproval": {"approvers": [42]}},
        {"entities": ["switch.field_*_valve"], "maxCallsPerHour": 6, "minSecondsBetween": 30},
    ]
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": rules}}))
    done = farmhost("doctor", "--json", data_dir=data_dir)
    line = next(c for c in json.loads(done.stdout) if c["part"] == "actuator rules")
    assert line["state"] == "ok"
    assert line["detail"] == (
        "2 rule(s): 1. entities switch.irrigation_pump: approval by users 42 within 10 min, off after 1800 s on; "
        "2. entities switch.field_*_valve: at most 6 calls an hour, 30 s between calls"
    )
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": [{"entities": ["x.y"], "maxOn": 1}]}}))
    broken = farmhost("doctor", "--json", data_dir=data_dir)
    profile = next(c for c in json.loads(broken.stdout) if c["part"] == "farm profile")
    assert profile["state"] == "broken" and "policy.rules.0.maxOn: unknown key" in profile["detail"]


def test_doctor_warns_when_ha_token_is_the_owners_and_not_farmhosts_own_user(
    tmp_path: Path, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    data_dir = tmp_path / "data"
    _, own = _report(data_dir, **ha_env)  # the harness gives farmhost a user of its own
    _, owner = _report(data_dir, HA_URL=ha_reset.url, HA_TOKEN=ha_reset.token)

    assert own["home assistant"]["state"] == "ok"
    assert own["ha user"]["state"] == "ok" and "own HA user 'farmhost'" in own["ha user"]["detail"], own["ha user"]
    assert owner["ha user"]["state"] == "warn", owner["ha user"]
    assert "the owner's" in owner["ha user"]["detail"] and "counts as the agents'" in owner["ha user"]["detail"]
    assert "HA_TOKEN" in owner["ha user"]["fix"]


def test_doctor_lists_the_guarded_entities_and_whether_the_daemon_follows_home_assistant(
    tmp_path: Path, ha_reset: HaInstance, ha_env: dict[str, str]
) -> None:
    data_dir = tmp_path / "data"
    farmhost("init", data_dir=data_dir, env=clean_env(**ha_env))
    rules = [
        {"entities": ["switch.irrigation_pump"], "requireApproval": True},
        {"entities": ["number.irrigation_duration"], "valueRange": [5, 120]},
        {"entities": ["switch.no_such_pump"], "maxOnSeconds": 60},
        {"services": ["light.*"], "requireApproval": True},  # guards the barn light, as /stop counts it
    ]
    (data_dir / "farm-profile.json").write_text(json.dumps({"policy": {"rules": rules}}))
    _, stopped = _report(data_dir, **ha_env)
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start(wait_group=None, timeout=30)
    try:
        wait_for(
            lambda: "following" in _report(data_dir, **ha_env)[1]["live view"]["detail"],
            timeout=30,
            what="the doctor to see the live view following HA",
        )
        _, running = _report(data_dir, **ha_env)
    finally:
        assert daemon.stop() == 0
    _, after = _report(data_dir, **ha_env)

    guarded = stopped["guarded"]
    assert guarded["state"] == "warn" and "nothing matches switch.no_such_pump" in guarded["detail"], guarded
    assert "switch.irrigation_pump (off, safe off)" in guarded["detail"]
    assert "light.barn_light (off, safe off)" in guarded["detail"]
    assert "number.irrigation_duration (" in guarded["detail"] and "safe 5)" in guarded["detail"]
    assert stopped["live view"]["state"] == "off" and "not running" in stopped["live view"]["detail"]
    assert running["live view"]["state"] == "ok", running["live view"]
    assert "following Home Assistant's events" in running["live view"]["detail"]
    assert after["live view"]["state"] == "off"
