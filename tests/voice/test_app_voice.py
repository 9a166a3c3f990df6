"""The daemon's engine: App makes it from Config.voice, hands it out as `app.stt`, and ends its worker at stop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from farmhost_testing import clean_env, scaled

PROBE = """
import asyncio, json, os, sys
from pathlib import Path
from farmhost.app import App
from farmhost.config import Settings

async def main() -> None:
    data, model, note = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]).read_bytes()
    app = App(Settings(_env_file=None, FARMHOST_DATA_DIR=data, FARMHOST_AGENT_RUNTIME="process",
                       FARMHOST_STT_MODEL=model))
    await app.start()
    said = await app.stt.transcribe(note)
    pid = app.stt.worker_pid
    await app.stop()
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    print(json.dumps({"engine": said.engine, "text": said.text, "alive": alive, "stt": repr(app.stt)}))

asyncio.run(main())
"""

IMPORTS = """
import sys
import farmhost.voice
from farmhost.config import load_config
from farmhost.voice import speech_to_text
speech_to_text(load_config(env_file=None).voice)
print(sorted(m for m in ("av", "faster_whisper", "ctranslate2", "wyoming", "numpy") if m in sys.modules))
"""


@pytest.mark.slow  # a daemon, the real Whisper model and its worker
def test_the_app_owns_the_engine_and_ends_its_worker_at_stop(
    data_dir: Path, whisper_base: Path, irrigation_note: bytes, tmp_path: Path
) -> None:
    note = tmp_path / "note.ogg"
    note.write_bytes(irrigation_note)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir), str(whisper_base), str(note)],
        capture_output=True, text=True, env=clean_env(), timeout=scaled(60), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["engine"] == f"faster-whisper ({whisper_base})"
    assert "irrigation" in seen["text"].lower()
    assert seen == seen | {"alive": False, "stt": "None"}


def test_the_engine_is_made_without_importing_the_voice_extra(tmp_path: Path) -> None:
    env = clean_env(FARMHOST_STT_URL="tcp://127.0.0.1:10300", FARMHOST_DATA_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]"
