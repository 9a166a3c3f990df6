"""`farmhost run`: a clean stop on SIGTERM and SIGINT, and one daemon per data directory."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from farmhost_testing import Daemon, drop, farmhost, scaled, wait_result

from farmhost.app import LOCK_WAIT_SECONDS


def _status(data_dir: Path, folder: str) -> dict[str, object]:
    doc = json.loads((data_dir / "ipc" / folder / "host_status.json").read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_stops_cleanly_on_a_signal(data_dir: Path, sig: signal.Signals) -> None:
    daemon = Daemon(data_dir).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    assert wait_result(data_dir, "field", drop(data_dir, "field", "actions", {"type": "ping"}))["status"] == "success"
    began = time.monotonic()
    assert daemon.stop(sig, timeout=10) == 0, daemon.log()
    assert time.monotonic() - began < scaled(10)
    for folder in ("main", "field"):
        status = _status(data_dir, folder)
        assert status["status"] == "stopped" and status["pid"] == pid
    assert "Traceback" not in daemon.log()
    # The no-daemon hint of `ipc send` now reads the stopped status.
    send = ("ipc", "send", "--group=main", "--queue=actions", '--json={"type":"ping"}', "--timeout=0.3")
    late = farmhost(*send, data_dir=data_dir)
    assert late.returncode == 2
    assert "not running" in late.stderr and "farmhost run" in late.stderr


def test_a_second_daemon_on_the_same_data_dir_refuses_to_start(daemon: Daemon, data_dir: Path) -> None:
    assert daemon.proc is not None
    first = daemon.proc.pid
    second = farmhost("run", data_dir=data_dir, timeout=20)
    assert second.returncode != 0
    assert "another farmhost daemon" in second.stderr and "already running" in second.stderr
    assert str(first) in second.stderr and "stop it first" in second.stderr
    assert "Traceback" not in second.stderr
    # The first one is untouched and still serves.
    assert daemon.proc.poll() is None
    assert _status(data_dir, "main")["pid"] == first
    assert _status(data_dir, "main")["status"] == "alive"
    assert wait_result(data_dir, "main", drop(data_dir, "main", "actions", {"type": "ping"}))["status"] == "success"


def _gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _held_lock(data_dir: Path, pid: int) -> int:
    """The data dir's lock held by this test process (a child of a killed daemon does so until it execs)."""
    fd = os.open(data_dir / "farmhost.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, str(pid).encode())
    return fd


def test_a_start_after_a_kill_9_waits_for_the_dead_daemons_child_to_let_go_of_the_lock(data_dir: Path) -> None:
    fd = _held_lock(data_dir, _gone_pid())
    threading.Timer(0.5, os.close, (fd,)).start()  # the child execs (or exits) and its copy of the lock closes
    daemon = Daemon(data_dir).start()
    try:
        assert wait_result(data_dir, "main", drop(data_dir, "main", "actions", {"type": "ping"}))["status"] == "success"
    finally:
        assert daemon.stop() == 0, daemon.log()


def test_a_lock_kept_by_a_dead_daemons_child_is_named_with_what_to_do(data_dir: Path) -> None:
    gone = _gone_pid()
    fd = _held_lock(data_dir, gone)
    try:
        began = time.monotonic()
        refused = farmhost("run", data_dir=data_dir, timeout=scaled(30))
        waited = time.monotonic() - began
    finally:
        os.close(fd)
    assert refused.returncode == 2, refused.stderr
    assert f"(pid {gone}, gone)" in refused.stderr and "fuser" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert waited >= LOCK_WAIT_SECONDS * 0.9, "it waited for the lock before giving up"
