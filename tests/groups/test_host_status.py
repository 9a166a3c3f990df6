"""The host_status.json heartbeat of every group, seen from outside the real daemon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, clean_env, wait_for

from farmhost import __version__


def _status(data_dir: Path, folder: str) -> dict[str, Any]:
    return json.loads((data_dir / "ipc" / folder / "host_status.json").read_text())  # type: ignore[no-any-return]


def test_heartbeat_advances_and_says_stopped_after_sigterm(data_dir: Path) -> None:
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_HEARTBEAT_SECONDS="0.2")).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    first = _status(data_dir, "field")
    assert {k: first[k] for k in ("status", "pid", "version")} == {
        "status": "alive",
        "pid": pid,
        "version": __version__,
    }
    assert first.keys() == {"status", "pid", "version", "startedAt", "heartbeatAt"}
    for folder in ("main", "field"):
        beat = _status(data_dir, folder)["heartbeatAt"]
        later = wait_for(
            lambda f=folder, b=beat: (s := _status(data_dir, f))["heartbeatAt"] != b and s, what=f"{folder} heartbeat"
        )
        assert later["heartbeatAt"] > beat and later["startedAt"] == first["startedAt"]
    assert daemon.stop() == 0
    for folder in ("main", "field"):
        stopped = _status(data_dir, folder)
        assert (stopped["status"], stopped["pid"], stopped["startedAt"]) == ("stopped", pid, first["startedAt"])
