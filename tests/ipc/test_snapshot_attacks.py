"""An agent that plants a directory where a snapshot goes gets it moved away; the host keeps writing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from farmhost_testing import Daemon, clean_env, quarantined, wait_for


def test_directory_in_place_of_host_status_is_evicted(data_dir: Path) -> None:
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_HEARTBEAT_SECONDS="0.2")).start()
    status = data_dir / "ipc" / "field" / "host_status.json"
    planted = data_dir / "planted"  # made beside, then renamed into place whole: the host never sees it half made
    planted.mkdir()
    (planted / "inside").write_text("agent data")
    try:
        for _ in range(100):  # the heartbeat (every 0.2 s) may put the file back between the unlink and the rename
            status.unlink(missing_ok=True)
            try:
                os.rename(planted, status)
                break
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                continue
        else:
            raise AssertionError(f"could not plant a directory at {status}")

        def rewritten() -> bool:
            return status.is_file() and json.loads(status.read_text())["status"] == "alive"

        wait_for(rewritten, timeout=5, what="host_status.json rewritten as a file")
        notes = wait_for(
            lambda: [n for n in quarantined(data_dir, "field") if n["file"] == "host_status.json"],
            what="the quarantine note of the planted directory",
        )
        assert len(notes) == 1
        assert "replaced by a directory" in notes[0]["reason"]
        moved = [p for p in (data_dir / "ipc" / "errors" / "field").iterdir() if p.is_dir()]
        assert [(p / "inside").read_text() for p in moved] == ["agent data"], "nothing the agent wrote is lost"
    finally:
        assert daemon.stop() == 0
    assert "cannot write host_status.json" not in daemon.log()
