"""The embedded engine: faster-whisper (int8 on the CPU, greedy decoding) in a worker process that comes and goes.

The worker (worker.py, driven by worker_client.py) starts with the first note and loads the model then, answers
notes one at a time, and ends after FARMHOST_STT_IDLE_SECONDS without one, returning its memory to the farm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from farmhost.voice.stt import Transcript
from farmhost.voice.worker_client import TRANSCRIBE_BASE, TRANSCRIBE_PER_SECOND, VoiceWorker

if TYPE_CHECKING:
    from farmhost.config import VoiceSettings


class EmbeddedEngine:
    """faster-whisper in a worker process; one per daemon (`App.stt`)."""

    def __init__(
        self,
        settings: VoiceSettings,
        *,
        transcribe_base: float = TRANSCRIBE_BASE,
        transcribe_per_second: float = TRANSCRIBE_PER_SECOND,
    ) -> None:
        if settings.model is None:
            raise ValueError("EmbeddedEngine needs FARMHOST_STT_MODEL")
        self._settings = settings
        self._model = settings.model
        self._worker = VoiceWorker(
            settings,
            model=settings.model,
            transcribe_base=transcribe_base,
            transcribe_per_second=transcribe_per_second,
        )

    @property
    def description(self) -> str:
        """The engine and its model."""
        return f"faster-whisper ({self._model})"

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id while it runs."""
        return self._worker.worker_pid

    @property
    def loads(self) -> int:
        """How often the model was loaded (a fresh worker loads it again)."""
        return self._worker.loads

    async def transcribe(self, audio: bytes) -> Transcript:
        """The words of one note; the worker is started and the model loaded first if they are not."""
        answer = await self._worker.transcribe(audio)
        return Transcript(
            text=str(answer["text"]),
            language=answer.get("language") or self._settings.language,
            seconds=float(answer["seconds"]),
            engine=self.description,
        )

    async def load(self) -> float:
        """Start the worker and load the model now (the doctor's proof); the seconds it took, ~0 if loaded."""
        return await self._worker.load()

    async def aclose(self) -> None:
        """End the worker at once (a note being transcribed gets EngineUnavailable); idempotent."""
        await self._worker.aclose()
