"""The daemon answers a ping and stops cleanly."""

from __future__ import annotations

import json
from pathlib import Path

from farmhost_testing import Daemon, drop, wait_result


def test_ping_roundtrip_and_clean_stop(data_dir: Path) -> None:
    d = Daemon(data_dir).start()
    rid = drop(data_dir, "field", "actions", {"type": "ping", "requestId": "p-1"})
    result = wait_result(data_dir, "field", rid)
    assert result["status"] == "success"
    assert result["result"]["pong"] is True
    assert d.stop() == 0
    status = json.loads((data_dir / "ipc" / "field" / "host_status.json").read_text())
    assert status["status"] == "stopped"
