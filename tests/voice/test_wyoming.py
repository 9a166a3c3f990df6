"""The Wyoming engine against a real wyoming-faster-whisper server running faster-whisper-base."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from voice_fixture import voice_settings

from farmhost.voice import EngineUnavailable, NoteTooLong, NoteUndecodable, speech_to_text
from farmhost.voice.wyoming import WyomingEngine
from farmhost_dev.voice import IRRIGATION_WORDS, WyomingServer, free_port, tone_note


@asynccontextmanager
async def _engine(url: str, **options: float | str | None) -> AsyncIterator[WyomingEngine]:
    engine = speech_to_text(voice_settings(url=url, **options))  # type: ignore[arg-type]
    assert isinstance(engine, WyomingEngine)
    try:
        yield engine
    finally:
        await engine.aclose()


async def test_an_english_note_becomes_its_words(wyoming_server: WyomingServer, irrigation_note: bytes) -> None:
    async with _engine(wyoming_server.url) as engine:
        said = await engine.transcribe(irrigation_note)
        decoder = engine.worker_pid
    assert all(word in said.text.lower() for word in IRRIGATION_WORDS), said
    assert 5.0 < said.seconds < 6.0
    assert said.engine == f"wyoming {wyoming_server.url}"
    assert "\n" not in said.text and said.text == said.text.strip()
    assert decoder is not None and not Path(f"/proc/{decoder}").exists()  # the decoding worker ends with the engine


@pytest.mark.slow  # two notes through a Wyoming server on the real model
async def test_two_notes_at_once_are_both_answered(wyoming_server: WyomingServer, irrigation_note: bytes) -> None:
    async with _engine(wyoming_server.url) as engine:
        both = await asyncio.gather(engine.transcribe(irrigation_note), engine.transcribe(irrigation_note))
    for said in both:
        assert "irrigation" in said.text.lower(), said


async def test_the_server_tells_its_model(wyoming_server: WyomingServer) -> None:
    async with _engine(wyoming_server.url) as engine:
        assert await engine.describe()


async def test_bad_and_long_notes_are_refused_before_anything_is_sent(irrigation_note: bytes) -> None:
    async with _engine(f"tcp://127.0.0.1:{free_port()}", max_seconds=3.0) as engine:  # no server: refused here
        with pytest.raises(NoteUndecodable):
            await engine.transcribe(b"OggS" + bytes(200))
        with pytest.raises(NoteTooLong):
            await engine.transcribe(tone_note(5.0))


async def test_a_server_that_is_down_is_reported_with_what_to_do(irrigation_note: bytes) -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    async with _engine(url) as engine:
        with pytest.raises(EngineUnavailable) as refused:
            await engine.transcribe(irrigation_note)
        with pytest.raises(EngineUnavailable):
            await engine.describe()
    message = str(refused.value)
    assert url in message and "FARMHOST_STT_URL" in message and "nothing listens there" in message
