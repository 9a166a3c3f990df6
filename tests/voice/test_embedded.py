"""The embedded engine: the real faster-whisper-base in its worker process, on notes spoken by espeak-ng."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from farmhost_testing import wait_for_async
from voice_fixture import voice_settings

from farmhost.voice import EngineUnavailable, NoteTooLong, NoteUndecodable, TranscriptionTimeout, speech_to_text
from farmhost.voice.embedded import EmbeddedEngine
from farmhost.voice.stt import INSTALL_HINT, missing_extra
from farmhost.voice.worker_client import worker_env
from farmhost_dev.voice import IRRIGATION_NOTE, IRRIGATION_WORDS, silent_note, spoken_note, tone_note


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _embedded(model: Path | str, **options: float | str | None) -> EmbeddedEngine:
    engine = speech_to_text(voice_settings(model=model, **options))  # type: ignore[arg-type]
    assert isinstance(engine, EmbeddedEngine)
    return engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def warm(whisper_base: Path) -> AsyncIterator[EmbeddedEngine]:
    """One engine for the module's cases that need a loaded model (the model loads once)."""
    engine = _embedded(whisper_base)
    yield engine
    pid = engine.worker_pid
    await engine.aclose()
    assert pid is None or not _alive(pid)


@pytest.fixture(scope="module")
def short_note() -> bytes:
    return spoken_note("Please switch on the water pump now.")


@pytest.mark.asyncio(loop_scope="module")
async def test_an_english_note_becomes_its_words(warm: EmbeddedEngine, irrigation_note: bytes) -> None:
    said = await warm.transcribe(irrigation_note)
    words = said.text.lower()
    assert all(word in words for word in IRRIGATION_WORDS), said
    assert said.language == "en"
    assert 5.0 < said.seconds < 6.0
    assert said.engine == warm.description == f"faster-whisper ({warm_model(warm)})"
    assert "\n" not in said.text and said.text == said.text.strip()


def warm_model(engine: EmbeddedEngine) -> str:
    return engine.description.removeprefix("faster-whisper (").removesuffix(")")


@pytest.mark.slow  # two notes through the real Whisper model side by side
@pytest.mark.asyncio(loop_scope="module")
async def test_two_notes_at_once_are_both_answered(warm: EmbeddedEngine, irrigation_note: bytes) -> None:
    import asyncio

    first, second = await asyncio.gather(warm.transcribe(irrigation_note), warm.transcribe(irrigation_note))
    for said in (first, second):
        assert all(word in said.text.lower() for word in IRRIGATION_WORDS), said


@pytest.mark.asyncio(loop_scope="module")
async def test_a_video_note_and_silence(warm: EmbeddedEngine) -> None:
    video = await warm.transcribe(spoken_note(IRRIGATION_NOTE, kind="mp4"))
    assert all(word in video.text.lower() for word in IRRIGATION_WORDS), video
    silence = await warm.transcribe(silent_note(3.0))
    assert silence.text == "" and silence.seconds == 3.0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_corrupt_note_is_refused_and_the_worker_stays(warm: EmbeddedEngine, irrigation_note: bytes) -> None:
    await warm.load()
    pid, loads = warm.worker_pid, warm.loads
    for bad in (b"", b"OggS" + bytes(range(256)) * 8, b"this is not audio at all", irrigation_note[:2000]):
        with pytest.raises(NoteUndecodable) as refused:
            await warm.transcribe(bad)
        assert str(refused.value).endswith(".") and "\n" not in str(refused.value)
    assert warm.worker_pid == pid  # nothing else lost: the same worker, the model still loaded
    await warm.load()
    assert warm.loads == loads  # not loaded again (counted by the worker's `loaded` events, not timed)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_note_over_the_limit_is_refused_before_the_model_loads(
    whisper_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:worker-must-not-see-this")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # tests/conftest.py sets it for the tests' own processes
    engine = _embedded(whisper_base, max_seconds=3.0)
    try:
        with pytest.raises(NoteTooLong) as refused:
            await engine.transcribe(tone_note(5.0))
        assert "3 seconds" in str(refused.value)
        assert engine.loads == 0
        # The worker, which parses untrusted audio, holds none of the daemon's secrets.
        environ = Path(f"/proc/{engine.worker_pid}/environ").read_bytes()
        assert b"worker-must-not-see-this" not in environ and b"PATH=" in environ
        # Its OpenMP threads sleep when they wait instead of spinning (the daemon's environment did not set it).
        assert b"\0OMP_WAIT_POLICY=PASSIVE\0" in b"\0" + environ
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_note_arriving_while_the_model_loads_waits_for_that_load(
    whisper_base: Path, irrigation_note: bytes, short_note: bytes
) -> None:
    import asyncio

    engine = _embedded(whisper_base)
    try:
        first = asyncio.create_task(engine.transcribe(irrigation_note))
        await wait_for_async(lambda: engine.worker_pid, what="the worker to start")
        assert engine.loads == 0  # still loading: the second note arrives now
        second = await engine.transcribe(short_note)
        assert "pump" in second.text.lower()
        assert "irrigation" in (await first).text.lower()
        assert engine.loads == 1
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_worker_ends_when_idle_and_the_next_note_loads_the_model_again(
    whisper_base: Path, short_note: bytes
) -> None:
    engine = _embedded(whisper_base, idle_seconds=0.3)
    try:
        assert "pump" in (await engine.transcribe(short_note)).text.lower()
        pid = engine.worker_pid
        assert pid is not None
        await wait_for_async(lambda: engine.worker_pid is None and not _alive(pid), what="the idle worker to end")
        assert "pump" in (await engine.transcribe(short_note)).text.lower()
        assert engine.worker_pid not in (None, pid)
        assert engine.loads == 2
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_transcription_past_its_time_budget_kills_the_worker(whisper_base: Path) -> None:
    # 0.2 s for any note: no CPU transcribes 20 s of speech in that; loading has its own budget.
    engine = EmbeddedEngine(voice_settings(model=whisper_base), transcribe_base=0.2, transcribe_per_second=0.0)
    try:
        await engine.load()
        pid = engine.worker_pid
        assert pid is not None
        with pytest.raises(TranscriptionTimeout) as stopped:
            await engine.transcribe(spoken_note(IRRIGATION_NOTE, repeat=4))
        assert "took too long" in str(stopped.value)
        assert engine.worker_pid is None and not _alive(pid)
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_missing_model_directory_is_reported_with_what_to_fix(tmp_path: Path, short_note: bytes) -> None:
    engine = _embedded(tmp_path / "no-model")
    try:
        with pytest.raises(EngineUnavailable) as refused:
            await engine.transcribe(short_note)
        assert "FARMHOST_STT_MODEL" in str(refused.value) and str(tmp_path / "no-model") in str(refused.value)
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_set_language_is_used(whisper_base: Path) -> None:
    engine = _embedded(whisper_base, language="es")
    try:
        said = await engine.transcribe(spoken_note("Enciende la bomba de riego del campo dos.", voice="es"))
        assert said.language == "es"
        assert said.text
    finally:
        await engine.aclose()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_closed_engine_refuses_notes(whisper_base: Path, short_note: bytes) -> None:
    engine = _embedded(whisper_base)
    await engine.aclose()
    with pytest.raises(EngineUnavailable):
        await engine.transcribe(short_note)


def test_the_workers_environment_keeps_the_operators_openmp_choice_and_no_secret() -> None:
    daemon = {"PATH": "/usr/bin", "HA_TOKEN": "secret", "HF_TOKEN": "hf-secret", "OMP_WAIT_POLICY": "ACTIVE"}
    assert worker_env(daemon) == {"PATH": "/usr/bin", "OMP_WAIT_POLICY": "ACTIVE"}
    assert worker_env({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin", "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_missing_extra_is_named_with_how_to_install_it() -> None:
    error = missing_extra("json", "farmhost_no_such_voice_module")
    assert isinstance(error, EngineUnavailable)
    assert "farmhost[voice]" in str(error) and INSTALL_HINT in str(error)
    assert str(error).count(". ") == 0 and str(error).endswith(".")
    assert missing_extra("json") is None


def test_no_engine_when_neither_model_nor_url_is_set() -> None:
    assert speech_to_text(voice_settings()) is None
    wyoming = speech_to_text(voice_settings(url="tcp://127.0.0.1:10300"))
    assert wyoming is not None and wyoming.description == "wyoming tcp://127.0.0.1:10300"
