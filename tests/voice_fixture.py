"""Fixtures for the voice-note tests: the real Whisper model, spoken notes, a real Wyoming server.

The pieces live in farmhost_dev/voice.py (shared with bench/voice_stt.py); this plugin makes them fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from farmhost.config import VoiceSettings
from farmhost_dev.hf_hub import WHISPER_BASE_REPO, LocalHub
from farmhost_dev.voice import IRRIGATION_NOTE, WyomingServer, spoken_note, whisper_model


@pytest.fixture(scope="session")
def whisper_base() -> Path:
    """faster-whisper-base, assembled once into ~/.cache/farmhost-whisper/base."""
    return whisper_model()


@pytest.fixture(scope="session")
def irrigation_note() -> bytes:
    """The 5.4 s English note about the irrigation pump, as OGG/Opus."""
    return spoken_note(IRRIGATION_NOTE)


@pytest.fixture(scope="session")
def wyoming_server(whisper_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WyomingServer]:
    """wyoming-faster-whisper serving faster-whisper-base on a free port, started once (shared_workers.py)."""
    server = WyomingServer(whisper_base, tmp_path_factory.mktemp("wyoming"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def local_hub(whisper_base: Path) -> Iterator[LocalHub]:
    """A stand-in for the Hugging Face Hub on 127.0.0.1 serving faster-whisper-base as Systran/faster-whisper-base.

    Shared by the session: a test clears its request count (`local_hub.clear()`) before it counts.
    """
    with LocalHub({WHISPER_BASE_REPO: whisper_base}) as hub:
        yield hub


def voice_settings(
    *,
    model: Path | str | None = None,
    url: str | None = None,
    language: str | None = None,
    max_seconds: float = 120.0,
    idle_seconds: float = 300.0,
    models_dir: Path = Path("/nonexistent/models"),
) -> VoiceSettings:
    """A VoiceSettings section as build_config makes it."""
    return VoiceSettings(
        model=str(model) if model is not None else None,
        url=url,
        language=language,
        max_seconds=max_seconds,
        idle_seconds=idle_seconds,
        models_dir=models_dir,
    )
