"""Voice notes inside the farmhost image and the add-on: the `voice` extra is installed (VOICE=1) and hears a note.

The images are the ones scripts/docker-images builds (tests/docker_engine.py). The product's embedded engine runs in
the image as the daemon runs it (its worker process, as uid 1000), with the test model and a spoken note mounted
read-only: the words come back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from docker_engine import ADDON_IMAGE, FARMHOST_IMAGE, docker, image, requires_engine

from farmhost_dev.voice import IRRIGATION_WORDS

pytestmark = [requires_engine, pytest.mark.slow]

# What the daemon does with a note (farmhost/voice/embedded.py), run in the image on the mounted note.
TRANSCRIBE = """
import asyncio, json, pathlib
from farmhost.config import VoiceSettings
from farmhost.voice.embedded import EmbeddedEngine

async def main():
    settings = VoiceSettings(model="/model", url=None, language="en", max_seconds=120.0, idle_seconds=300.0,
                             models_dir=pathlib.Path("/tmp/models"))
    engine = EmbeddedEngine(settings)
    try:
        said = await engine.transcribe(pathlib.Path("/notes/note.ogg").read_bytes())
    finally:
        await engine.aclose()
    print(json.dumps({"text": said.text, "seconds": said.seconds}))

asyncio.run(main())
"""


@pytest.mark.parametrize("name", [FARMHOST_IMAGE, ADDON_IMAGE])
def test_the_image_transcribes_a_voice_note(
    name: str, tmp_path: Path, whisper_base: Path, irrigation_note: bytes
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir(mode=0o755)
    (notes / "note.ogg").write_bytes(irrigation_note)
    (notes / "note.ogg").chmod(0o644)
    done = docker(
        "run", "--rm", "--user", "1000:1000", "--network", "none", "--entrypoint", "/app/.venv/bin/python",
        "-v", f"{whisper_base}:/model:ro", "-v", f"{notes}:/notes:ro",
        image(name), "-c", TRANSCRIBE,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    heard = json.loads(done.stdout.splitlines()[-1])
    assert all(word in heard["text"].lower() for word in IRRIGATION_WORDS), heard
    assert 5 < heard["seconds"] < 7
