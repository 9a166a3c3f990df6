"""`farmhost doctor`'s checks of the machine and the LLM: each failure provoked on real files, servers and clocks."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import clean_env, farmhost, scaled
from inotify_simple import INotify
from inotify_simple import flags as f

from farmhost.cli.hostchecks import (
    InotifyUse,
    clock_check,
    data_dir_check,
    disk_check,
    inotify_check,
    inotify_in_use,
    inotify_needs,
    timezone_check,
)

API_KEY = "sk-doctor-secret-key-0123456789"
MODEL = "farm-model"
FAST = {"FARMHOST_AGENT_RUNTIME": "process", "TZ": "Europe/Lisbon"}  # skip the bwrap trial: not what is tested here


class LlmApi(ThreadingHTTPServer):
    """A tiny OpenAI-compatible `GET /v1/models`: 401 for a wrong key, 404 elsewhere, optionally slow."""

    daemon_threads = True

    def __init__(self, *, models: list[str], delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _LlmHandler)
        self.models, self.delay = models, delay
        self.auth: list[str | None] = []

    @property
    def base_url(self) -> str:
        """FARMHOST_LLM_BASE_URL."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _LlmHandler(BaseHTTPRequestHandler):
    server: LlmApi

    def do_GET(self) -> None:
        self.server.auth.append(self.headers.get("Authorization"))
        time.sleep(self.server.delay)
        if self.path != "/v1/models":
            status, body = 404, {"error": {"message": f"no route {self.path}"}}
        elif self.headers.get("Authorization") != f"Bearer {API_KEY}":
            status, body = 401, {"error": {"message": "Incorrect API key provided"}}
        else:
            status, body = 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@contextmanager
def _serve(server: LlmApi) -> Iterator[LlmApi]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def llm_api() -> Iterator[LlmApi]:
    with _serve(LlmApi(models=[MODEL, "other-model"])) as server:
        yield server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _doctor(data_dir: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, str]]]:
    done = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(**FAST, **env))
    assert "Traceback" not in done.stderr, done.stderr
    checks = {c["part"]: c for c in json.loads(done.stdout)}
    broken = any(c["state"] == "broken" for c in checks.values())
    assert done.returncode == (1 if broken else 0), done.stderr
    return done, checks


# ---------------------------------------------------------------------------------------------------- LLM


def test_llm_endpoint_reachable_refused_unreachable_and_wrong_model(tmp_path: Path, llm_api: LlmApi) -> None:
    data = tmp_path / "data"
    llm = {"FARMHOST_LLM_BASE_URL": llm_api.base_url, "FARMHOST_LLM_MODEL": MODEL}
    cases = {
        "ok": {**llm, "FARMHOST_LLM_API_KEY": API_KEY},
        "wrong key": {**llm, "FARMHOST_LLM_API_KEY": "sk-wrong-key-9876543210"},
        "unknown model": {**llm, "FARMHOST_LLM_API_KEY": API_KEY, "FARMHOST_LLM_MODEL": "gpt-nonexistent"},
        "no /v1": {**llm, "FARMHOST_LLM_API_KEY": API_KEY, "FARMHOST_LLM_BASE_URL": llm_api.base_url[: -len("/v1")]},
        "unreachable": {**llm, "FARMHOST_LLM_BASE_URL": f"http://127.0.0.1:{_closed_port()}/v1"},
        "half configured": {"FARMHOST_LLM_BASE_URL": llm_api.base_url},
    }
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        runs = dict(zip(cases, pool.map(lambda env: _doctor(data, **env), cases.values()), strict=True))
    llm_lines = {name: checks["llm"] for name, (_, checks) in runs.items()}

    assert llm_lines["ok"]["state"] == "ok", llm_lines["ok"]
    assert f"model '{MODEL}' at {llm_api.base_url}, reachable, 2 model(s) offered" == llm_lines["ok"]["detail"]
    assert f"Bearer {API_KEY}" in llm_api.auth, "the key goes to the endpoint"

    refused = llm_lines["wrong key"]
    assert refused["state"] == "broken" and "401" in refused["detail"] and "FARMHOST_LLM_API_KEY" in refused["fix"]
    assert llm_lines["unknown model"]["state"] == "warn"
    assert "'gpt-nonexistent'" in llm_lines["unknown model"]["detail"] and MODEL in llm_lines["unknown model"]["detail"]
    assert llm_lines["no /v1"]["state"] == "warn" and "404" in llm_lines["no /v1"]["detail"]
    assert "/v1" in llm_lines["no /v1"]["fix"]
    unreachable = llm_lines["unreachable"]
    assert unreachable["state"] == "broken" and "unreachable" in unreachable["detail"]
    assert "FARMHOST_LLM_BASE_URL" in unreachable["fix"]
    half = llm_lines["half configured"]
    assert half["state"] == "off" and half["detail"] == "FARMHOST_LLM_MODEL not set"
    for done, _ in runs.values():
        assert "sk-wrong-key" not in done.stdout + done.stderr and API_KEY not in done.stdout + done.stderr


def test_each_endpoint_of_the_fallback_chain_is_checked(tmp_path: Path, llm_api: LlmApi) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    env = {
        "FARMHOST_LLM_BASE_URL": dead,
        "FARMHOST_LLM_MODEL": "hosted-model",
        "FARMHOST_LLM_2_BASE_URL": llm_api.base_url,
        "FARMHOST_LLM_2_MODEL": MODEL,
        "FARMHOST_LLM_2_API_KEY": API_KEY,
        "FARMHOST_LLM_3_BASE_URL": llm_api.base_url,
        "FARMHOST_LLM_3_MODEL": "not-offered",
        "FARMHOST_LLM_3_API_KEY": API_KEY,
    }
    done, checks = _doctor(tmp_path / "data", **env)
    first, second, third = checks["llm"], checks["llm 2"], checks["llm 3"]
    assert first["state"] == "broken" and "unreachable" in first["detail"] and "FARMHOST_LLM_BASE_URL" in first["fix"]
    assert second == {
        "part": "llm 2",
        "state": "ok",
        "detail": f"fallback 2: model '{MODEL}' at {llm_api.base_url}, reachable, 2 model(s) offered",
        "fix": "",
    }
    assert third["state"] == "warn" and third["detail"].startswith("fallback 3: ")
    assert third["fix"] == "set FARMHOST_LLM_3_MODEL to a model the endpoint offers"
    assert API_KEY not in done.stdout + done.stderr


def test_a_slow_probe_says_what_it_waits_for_and_a_dead_one_gives_up(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _serve(LlmApi(models=[MODEL], delay=2.0)) as server:
        env = {"FARMHOST_LLM_BASE_URL": server.base_url, "FARMHOST_LLM_MODEL": MODEL, "FARMHOST_LLM_API_KEY": API_KEY}
        began = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "farmhost", "doctor", "--data-dir", str(data)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(**FAST, **env),
            cwd=tmp_path,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_at = time.monotonic()
        out, err = proc.communicate(timeout=scaled(30))
        ended = time.monotonic()
    # The report starts before the slow endpoint answers; the wait is announced, then its line comes.
    assert first.startswith("python ") and ended - first_at > 1.0, (first, ended - first_at)
    assert f"doctor: waiting for the LLM endpoint {server.base_url}/models (at most 9 s)" in err
    assert any(line.startswith("llm ") and " ok " in line for line in out.splitlines()), out
    # An endpoint that accepts the connection and never answers: broken after the probe's timeout, no hang.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        started = time.monotonic()
        _, checks = _doctor(data, FARMHOST_LLM_BASE_URL=f"http://127.0.0.1:{port}/v1", FARMHOST_LLM_MODEL=MODEL)
        took = time.monotonic() - started
    assert checks["llm"]["state"] == "broken" and checks["llm"]["detail"].endswith("gave no answer within 5 s"), checks[
        "llm"
    ]
    # The probe's 5 s and the rest of the report, which takes about as long as the run above (whose endpoint
    # answered after 2 s) on this machine now: no hang, which would last until the subprocess timeout (60 s scaled).
    baseline = ended - began
    assert took < 5 + baseline + scaled(5), (took, baseline)


# ---------------------------------------------------------------------------------------------------- disk


def test_disk_thresholds(tmp_path: Path) -> None:
    usage = shutil.disk_usage(tmp_path)
    real = disk_check(tmp_path)
    assert "free of" in real.detail and real.state in {"ok", "warn", "broken"}
    # The real filesystem, judged by thresholds just above and below what it has free.
    broken = disk_check(tmp_path, broken_bytes=usage.free + 2**30)
    assert broken.state == "broken" and "writes will fail" in broken.detail
    assert "logs/runs/" in broken.fix
    low = disk_check(tmp_path, warn_bytes=usage.free + 2**30, broken_bytes=0)
    assert low.state == "warn" and low.fix
    share = disk_check(tmp_path, warn_bytes=0, warn_fraction=1.0, broken_bytes=0)
    assert share.state == "warn", "under the 5 % rule (here: 100 %) even with bytes to spare"
    fine = disk_check(tmp_path, warn_bytes=0, warn_fraction=0.0, broken_bytes=0)
    assert fine.state == "ok" and fine.fix == ""
    # A data dir that does not exist yet is judged on the filesystem it will be created on.
    assert disk_check(tmp_path / "not" / "yet", broken_bytes=usage.free + 2**30).state == "broken"


# ---------------------------------------------------------------------------------------------------- inotify


def _limits(tmp_path: Path, watches: int, instances: int) -> Path:
    proc_sys = tmp_path / f"inotify-{watches}-{instances}"
    proc_sys.mkdir(exist_ok=True)
    (proc_sys / "max_user_watches").write_text(f"{watches}\n")
    (proc_sys / "max_user_instances").write_text(f"{instances}\n")
    return proc_sys


def test_inotify_limits_against_what_the_groups_need(tmp_path: Path) -> None:
    need_watches, need_instances = inotify_needs(groups=5, max_agents=2)
    assert (need_watches, need_instances) == (4 * 5 + 2 + 1, 1 + 2 + 1)
    ok = inotify_check(groups=5, max_agents=2, proc_sys=_limits(tmp_path, 8192, 128))
    assert ok.state == "ok" and f"farmhost needs {need_watches} for 5 group(s)" in ok.detail
    few_watches = inotify_check(groups=5, max_agents=2, proc_sys=_limits(tmp_path, need_watches - 1, 128))
    assert few_watches.state == "broken"
    assert "sudo sysctl fs.inotify.max_user_watches=8192 fs.inotify.max_user_instances=256" in few_watches.fix
    assert "/etc/sysctl.d/" in few_watches.fix and "FARMHOST_IPC_MODE=poll" in few_watches.fix
    few_instances = inotify_check(groups=5, max_agents=2, proc_sys=_limits(tmp_path, 8192, need_instances - 1))
    assert few_instances.state == "broken" and f"(needs {need_instances})" in few_instances.detail
    # Enough for farmhost alone, but the user's other programs already hold most of it.
    crowded = inotify_check(
        groups=5, max_agents=2, proc_sys=_limits(tmp_path, 8192, 128), in_use=InotifyUse(instances=3, watches=8180)
    )
    assert crowded.state == "warn" and "8,180 watch(es)" in crowded.detail
    assert "max_user_watches=16406" in crowded.fix  # twice what is in use plus what farmhost needs
    unreadable = inotify_check(groups=1, max_agents=2, proc_sys=tmp_path / "missing")
    assert unreadable.state == "broken" and unreadable.fix == "set FARMHOST_IPC_MODE=poll"
    assert inotify_check(groups=1, max_agents=2, ipc_mode="poll").state == "off"


def test_inotify_use_is_counted_from_proc(tmp_path: Path) -> None:
    # A /proc holding only this process: the other test workers open and close inotify instances meanwhile.
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    before = inotify_in_use(os.getuid(), proc=proc)
    with INotify() as one, INotify() as two:
        for name in ("a", "b", "c"):
            (tmp_path / name).mkdir()
        one.add_watch(str(tmp_path / "a"), f.CREATE)
        two.add_watch(str(tmp_path / "b"), f.CREATE)
        two.add_watch(str(tmp_path / "c"), f.CREATE)
        during = inotify_in_use(os.getuid(), proc=proc)
        mine = inotify_in_use(os.getuid(), exclude={os.getpid()}, proc=proc)
        everyone = inotify_in_use(os.getuid())
    assert during.instances - before.instances == 2 and during.watches - before.watches == 3
    assert mine.instances == 0 and mine.watches == 0, "an excluded pid (the running daemon) is not counted"
    assert everyone.instances >= during.instances and everyone.watches >= during.watches
    assert inotify_in_use(os.getuid() + 1, proc=proc).instances == 0, "another user's processes are not counted"


# ---------------------------------------------------------------------------------------------------- clock


def _timedatectl(tmp_path: Path, answer: str, code: int = 0) -> str:
    """A stand-in for systemd's timedatectl (no systemd here): prints `answer` for `show -p NTPSynchronized`."""
    script = tmp_path / f"timedatectl-{answer or 'none'}-{code}"
    script.write_text(
        f'#!/bin/sh\n[ "$1 $2 $3" = "show -p NTPSynchronized" ] || exit 2\necho "{answer}"\nexit {code}\n'
    )
    script.chmod(0o755)
    return str(script)


def test_clock_behind_the_database_and_the_install_is_broken(data_dir: Path) -> None:
    healthy, _ = _doctor(data_dir)
    assert '"part": "clock"' in healthy.stdout
    ahead = (datetime.now(UTC) + timedelta(days=3)).isoformat(timespec="milliseconds")
    with sqlite3.connect(data_dir / "farmhost.db") as conn:
        conn.execute("UPDATE groups SET added_at = ? WHERE folder = 'field'", (ahead,))
    conn.close()
    _, checks = _doctor(data_dir)
    clock = checks["clock"]
    assert clock["state"] == "broken", clock
    assert "farmhost.db has a record from" in clock["detail"] and "(3 days later)" in clock["detail"]
    assert "timedatectl set-ntp true" in clock["fix"] and "Raspberry Pi" in clock["fix"]
    # A clock before farmhost was installed (a Pi booting without network) is wrong whatever the database says.
    stale = clock_check(data_dir / "nothing.db", now=datetime(2024, 3, 1, tzinfo=UTC), timedatectl=None)
    assert stale.state == "broken" and "the clock says 2024-03-01 00:00:00 UTC, before farmhost" in stale.detail


def test_ntp_synchronisation_where_timedatectl_answers(tmp_path: Path) -> None:
    db = tmp_path / "farmhost.db"
    unsynced = clock_check(db, timedatectl=_timedatectl(tmp_path, "no"))
    assert unsynced.state == "warn" and "NTP is not synchronised" in unsynced.detail and unsynced.fix
    synced = clock_check(db, timedatectl=_timedatectl(tmp_path, "yes"))
    assert synced.state == "ok" and synced.detail.endswith("NTP synchronised")
    no_systemd = clock_check(db, timedatectl=_timedatectl(tmp_path, "", code=1))
    assert no_systemd.state == "ok" and "NTP state unknown" in no_systemd.detail
    assert clock_check(db, timedatectl="no-such-timedatectl").state == "ok"


# ---------------------------------------------------------------------------------------------------- time zone


def test_time_zone(tmp_path: Path) -> None:
    summer = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    pinned = timezone_check("Europe/Lisbon", ZoneInfo("Europe/Lisbon"), now=summer)
    assert pinned.state == "ok" and pinned.detail == "Europe/Lisbon (from TZ), local time 13:00 WEST (UTC+0100)"
    system = timezone_check(None, ZoneInfo("Asia/Tokyo"), now=summer)
    assert system.state == "ok" and system.detail.startswith("Asia/Tokyo (the system zone; set TZ to pin it)")
    utc = timezone_check(None, ZoneInfo("Etc/UTC"), now=summer)
    assert utc.state == "warn" and "TZ=Europe/Lisbon" in utc.fix
    # A TZ that is no zone stops the doctor like every command: one line naming TZ and what to use instead.
    bogus = farmhost("doctor", data_dir=tmp_path / "data", env=clean_env(TZ="Mars/Olympus_Mons"))
    assert bogus.returncode == 2 and bogus.stdout == ""
    assert bogus.stderr.strip() == (
        "farmhost: error: TZ: unknown time zone (use an IANA name such as Europe/Lisbon) (got 'Mars/Olympus_Mons')"
    )


# ---------------------------------------------------------------------------------------------------- data dir


def test_data_dir_check_ignores_files_that_come_and_go_while_it_looks(tmp_path: Path) -> None:
    # The doctor's other checks open the database beside this one: SQLite's -wal and -shm appear and vanish
    # between the listing and the look at each entry. Churn such files as fast as possible while the check runs.
    root = tmp_path / "data"
    (root / "groups" / "main").mkdir(parents=True)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for name in ("farmhost.db-wal", "farmhost.db-shm", "x1", "x2", "x3"):
                (root / name).touch()
            for name in ("farmhost.db-wal", "farmhost.db-shm", "x1", "x2", "x3"):
                (root / name).unlink()

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        states = {data_dir_check(root).state for _ in range(400)}
    finally:
        stop.set()
        worker.join()
    assert states == {"ok"}


def test_data_dir_owned_by_another_user(data_dir: Path) -> None:
    if os.geteuid() == 0:
        # root can write anything, but what it creates now would lock the farmhost user out: a warning.
        os.chown(data_dir / "farmhost.db", 65534, 65534)
        os.chown(data_dir / "groups" / "main", 65534, 65534)
        _, checks = _doctor(data_dir)
        line = checks["data dir"]
        assert line["state"] == "warn", line
        # The two entries, plus SQLite's -wal/-shm when a check has the database open (as root, SQLite gives them
        # the database's owner).
        counted = re.search(r"(\d+) entries", line["detail"])
        assert counted and 2 <= int(counted[1]) <= 4, line
        assert "belong to another user than root" in line["detail"]
        assert f"sudo chown -R root: {data_dir}" in line["fix"]
    else:
        data_dir.chmod(0o555)
        try:
            _, checks = _doctor(data_dir)
        finally:
            data_dir.chmod(0o755)
        assert checks["data dir"]["state"] == "broken" and "not writable" in checks["data dir"]["detail"]
