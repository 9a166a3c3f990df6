"""Voice: voice notes turned into text on the farm, by an embedded Whisper model or a Wyoming server.

Importing this package is cheap: the engines import PyAV, faster-whisper and wyoming (the `voice` extra) only when
a note is transcribed, and the model itself lives in a worker process (docs/voice.md).
"""

from farmhost.voice.stt import (
    EngineUnavailable,
    ModelNotFetched,
    NoteTooLong,
    NoteUndecodable,
    SpeechToText,
    Transcript,
    TranscriptionTimeout,
    VoiceError,
    speech_to_text,
)

__all__ = [
    "EngineUnavailable",
    "ModelNotFetched",
    "NoteTooLong",
    "NoteUndecodable",
    "SpeechToText",
    "Transcript",
    "TranscriptionTimeout",
    "VoiceError",
    "speech_to_text",
]
