"""The daemon answers a ping and stops cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from farmhost_testing import Daemon, clean_env, drop, wait_result


def test_ping_roundtrip_and_clean_stop(data_dir: Path) -> None:
    d = Daemon(data_dir).start()
    rid = drop(data_dir, "field", "actions", {"type": "ping", "requestId": "p-1"})
    result = wait_result(data_dir, "field", rid)
    assert result["status"] == "success"
    assert result["result"]["pong"] is True
    assert d.stop() == 0
    status = json.loads((data_dir / "ipc" / "field" / "host_status.json").read_text())
    assert status["status"] == "stopped"


PROBE = """
import asyncio, sys
from pathlib import Path
from farmhost.app import App
from farmhost.config import Settings

async def main() -> None:
    app = App(Settings(_env_file=None, FARMHOST_DATA_DIR=Path(sys.argv[1])))
    await app.start()
    await app.stop()

asyncio.run(main())
print(sorted(m for m in ("telegram", "httpx", "PIL") if m in sys.modules))
"""


def test_a_daemon_without_telegram_never_loads_the_telegram_client(data_dir: Path) -> None:
    # python-telegram-bot and httpx cost ~20 MB of RSS (docs/performance.md): only a bot token loads them. Pillow
    # (3.6 MB) loads only when a photo is prepared for a model that can see.
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir)], capture_output=True, text=True, env=clean_env(), timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
