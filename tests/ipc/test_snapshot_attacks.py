"""An agent that plants a directory where a snapshot goes gets it moved away; the host keeps writing."""

from __future__ import annotations

import json
from pathlib import Path

from farmhost_testing import Daemon, clean_env, quarantined, wait_for


def test_directory_in_place_of_host_status_is_evicted(data_dir: Path) -> None:
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_HEARTBEAT_SECONDS="0.2")).start()
    status = data_dir / "ipc" / "field" / "host_status.json"
    try:
        status.unlink()
        status.mkdir()
        (status / "inside").write_text("agent data")

        def rewritten() -> bool:
            return status.is_file() and json.loads(status.read_text())["status"] == "alive"

        wait_for(rewritten, timeout=5, what="host_status.json rewritten as a file")
        notes = [n for n in quarantined(data_dir, "field") if n["file"] == "host_status.json"]
        assert len(notes) == 1
        assert "replaced by a directory" in notes[0]["reason"]
        moved = [p for p in (data_dir / "ipc" / "errors" / "field").iterdir() if p.is_dir()]
        assert [(p / "inside").read_text() for p in moved] == ["agent data"], "nothing the agent wrote is lost"
    finally:
        assert daemon.stop() == 0
    assert "cannot write host_status.json" not in daemon.log()
