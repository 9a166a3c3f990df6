"""The worker's Whisper model runs its encoder once per window, also when it detects the language first.

The real faster-whisper-base in this process, on notes spoken by espeak-ng. faster-whisper 1.2 alone encodes a
note's first window twice when the language is left to detection (once to detect, once to transcribe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faster_whisper import WhisperModel
from faster_whisper.audio import pad_or_trim

from farmhost.voice.audio import decode
from farmhost.voice.whisper_model import OneEncodePerWindow
from farmhost_dev.voice import IRRIGATION_NOTE, spoken_note

GERMAN_NOTE = "Bitte schalte die Pumpe im Gewächshaus ein und prüfe die Bodenfeuchte."


class _CountedEncoder(WhisperModel):  # type: ignore[misc]
    """faster-whisper's model, counting the runs of its encoder (what OneEncodePerWindow's `super().encode` reaches)."""

    encoder_runs = 0

    def encode(self, features: np.ndarray) -> Any:
        self.encoder_runs += 1
        return super().encode(features)


class _Counted(OneEncodePerWindow, _CountedEncoder):
    """The worker's model over the counting one: its MRO puts the count between it and faster-whisper."""


@pytest.fixture(scope="module")
def model(whisper_base: Path) -> _Counted:
    return _Counted(str(whisper_base), device="cpu", compute_type="int8", cpu_threads=2, num_workers=1)


def _audio(note: bytes) -> np.ndarray:
    pcm = decode(note, max_seconds=120)
    return np.frombuffer(pcm.samples, dtype=np.int16).astype(np.float32) / 32768.0


def _transcribe(model: WhisperModel, audio: np.ndarray, language: str | None) -> tuple[str, str]:
    # The worker's options (farmhost/voice/worker.py).
    segments, info = model.transcribe(
        audio, language=language, beam_size=1, vad_filter=True, condition_on_previous_text=False
    )
    return " ".join(segment.text for segment in segments), info.language


@pytest.mark.parametrize(("text", "voice", "language"), [(IRRIGATION_NOTE, "en", "en"), (GERMAN_NOTE, "de", "de")])
def test_a_detected_note_is_encoded_once_and_transcribed_as_with_its_language_given(
    model: _Counted, text: str, voice: str, language: str
) -> None:
    audio = _audio(spoken_note(text, voice=voice))
    before = model.encoder_runs
    detected, found = _transcribe(model, audio, None)
    assert found == language
    assert model.encoder_runs - before == 1, "detection and transcription share the window's one encoding"
    before = model.encoder_runs
    given, _ = _transcribe(model, audio, language)
    assert model.encoder_runs - before == 1
    assert detected == given and detected.strip(), (detected, given)


def test_only_the_same_window_is_answered_from_the_last_encoding(model: _Counted) -> None:
    features = model.feature_extractor(_audio(spoken_note(IRRIGATION_NOTE, repeat=7)))
    first, second = pad_or_trim(features[:, :3000]), pad_or_trim(features[:, 3000:6000])
    assert features.shape[-1] > 3000 and not np.array_equal(first, second)
    before = model.encoder_runs
    once = model.encode(first)
    assert model.encode(first) is once  # the same window again: the output kept
    other = model.encode(second)
    again = model.encode(first)  # not the last window any more: encoded anew, to the same values
    assert model.encoder_runs - before == 3
    assert np.array_equal(np.array(again), np.array(once)) and not np.array_equal(np.array(other), np.array(once))
