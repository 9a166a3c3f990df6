"""`farmhost run`: a clean stop on SIGTERM and SIGINT, and one daemon per data directory."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from farmhost_testing import Daemon, drop, farmhost, scaled, wait_result


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
