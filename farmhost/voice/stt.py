"""The speech-to-text seam: what a transcript is, the errors a farmer is told, and the engine the settings choose."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from farmhost.config import VoiceSettings

INSTALL_HINT = "install farmhost[voice] on the farm computer (pip install 'farmhost[voice]', or make install)"


@dataclass(frozen=True, kw_only=True)
class Transcript:
    """What was said in one voice note."""

    text: str  # the words on one line, whitespace collapsed ("" when nothing was said)
    language: str | None  # detected, or the configured FARMHOST_STT_LANGUAGE
    seconds: float  # the note's length
    engine: str  # which engine heard it, e.g. "faster-whisper (/models/base)" or "wyoming tcp://127.0.0.1:10300"


class VoiceError(Exception):
    """A voice note that could not be turned into text; str() is one sentence for the farmer, saying what to do."""


class NoteTooLong(VoiceError):
    """The note is longer than FARMHOST_STT_MAX_SECONDS (told from the decoded audio, before any transcription)."""


class NoteUndecodable(VoiceError):
    """The note is empty, corrupt, or not audio."""


class EngineUnavailable(VoiceError):
    """The engine cannot run: no model, a server that does not answer, or the `voice` extra not installed."""


class ModelNotFetched(EngineUnavailable):
    """A model named in FARMHOST_STT_MODEL is not on the farm computer yet and could not be downloaded now."""


class TranscriptionTimeout(EngineUnavailable):
    """The engine took longer than the note's time budget; the stuck worker was ended."""


class SpeechToText(Protocol):
    """An engine: transcribes notes without blocking the event loop, raising only VoiceError subclasses."""

    @property
    def description(self) -> str:
        """Which engine and model or server, for logs, the doctor and `Transcript.engine`."""
        ...

    async def transcribe(self, audio: bytes) -> Transcript:
        """The words of one voice note (OGG/Opus, MP3, M4A, or the sound of an MP4 video note).

        Raises:
            VoiceError: one of its subclasses, with a sentence for the farmer.
        """
        ...

    async def aclose(self) -> None:
        """Release the engine (end the worker process, close connections); idempotent."""
        ...


def missing_extra(*modules: str) -> EngineUnavailable | None:
    """The error to raise when one of `modules` (from the `voice` extra) is not installed, else None."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return EngineUnavailable(
                f"Voice notes cannot be transcribed because the speech-to-text part ({module}) is missing: "
                f"{INSTALL_HINT}."
            )
    return None


def speech_to_text(settings: VoiceSettings) -> SpeechToText | None:
    """The engine FARMHOST_STT_MODEL or FARMHOST_STT_URL configures, not started yet; None when voice notes are off."""
    if settings.url is not None:
        from farmhost.voice.wyoming import WyomingEngine

        return WyomingEngine(settings)
    if settings.model is not None:
        from farmhost.voice.embedded import EmbeddedEngine

        return EmbeddedEngine(settings)
    return None


def one_line(text: str) -> str:
    """`text` stripped, its whitespace runs made one space."""
    return " ".join(text.split())
