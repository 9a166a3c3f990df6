"""The Whisper model the speech-to-text worker loads: faster-whisper's, running its encoder once per window.

With the language left to detection (`FARMHOST_STT_LANGUAGE` unset, the default), faster-whisper 1.2's
`transcribe` encodes the note's first 30-second window to detect the language, drops that output and encodes the
window again to transcribe it: for a voice note of a few seconds the encoder is most of the work, so a note cost
about twice the CPU it needs (2.5 against 1.3 CPU-seconds for a 4-second note here; on a Raspberry Pi the farmer
waits that much longer for the answer). This model keeps the last window's encoder output and hands it back when
the very same features come again, so nothing is guessed: equal input, equal output. Detection is given what the
transcription's first window holds (faster-whisper's features end in one padding frame its transcription leaves
out), so the two are equal and the transcript is the one the language given explicitly would give.

Imported only in the worker process (it loads CTranslate2).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from faster_whisper import WhisperModel


class OneEncodePerWindow(WhisperModel):  # type: ignore[misc]  # faster-whisper ships no type information
    """`WhisperModel` whose `encode` answers a repeated window from the last output instead of encoding it again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last: tuple[np.ndarray, Any] | None = None

    def detect_language(
        self, audio: np.ndarray | None = None, features: np.ndarray | None = None, **kwargs: Any
    ) -> tuple[str, float, list[tuple[str, float]]]:
        """faster-whisper's detection, on the features without the padding frame `transcribe` does not transcribe."""
        if audio is None and features is not None and features.shape[-1] > 1:
            features = features[..., :-1]
        result: tuple[str, float, list[tuple[str, float]]] = super().detect_language(
            audio=audio, features=features, **kwargs
        )
        return result

    def encode(self, features: np.ndarray) -> Any:
        """The encoder's output for one window: the last one's again when `features` are the same, else computed."""
        last, self._last = self._last, None
        if last is not None and last[0].shape == features.shape and np.array_equal(last[0], features):
            return last[1]
        output = super().encode(features)
        self._last = (features, output)
        return output
