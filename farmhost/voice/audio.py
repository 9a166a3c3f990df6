"""Decoding a note (OGG/Opus, MP3, M4A, the sound of an MP4 video note) to 16 kHz mono PCM with PyAV.

Blocking and CPU-bound: the embedded engine calls it in its worker process, the Wyoming engine in a thread. The
length is counted from the decoded samples (a container's header may lie), and decoding stops as soon as the note
is over the limit, so a long or hostile file costs at most `max_seconds` of decoding.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Final

from farmhost.voice.stt import NoteTooLong, NoteUndecodable, missing_extra

SAMPLE_RATE: Final = 16_000  # what Whisper listens at, and what a Wyoming server is sent
SAMPLE_WIDTH: Final = 2  # 16-bit signed little-endian samples
# Decoded audio below this is not a voice note (a click, a header without sound).
MIN_SECONDS: Final = 0.1


@dataclass(frozen=True)
class Pcm:
    """A decoded note: 16 kHz mono 16-bit samples and its length."""

    samples: bytes
    seconds: float


def decode(data: bytes, *, max_seconds: float) -> Pcm:
    """The note's sound as 16 kHz mono PCM.

    Raises:
        NoteUndecodable: empty, corrupt, not audio, or silent for less than a tenth of a second.
        NoteTooLong: more than `max_seconds` of sound.
        EngineUnavailable: PyAV (of the `voice` extra) is not installed.
    """
    if (missing := missing_extra("av")) is not None:
        raise missing
    import av

    if not data:
        raise NoteUndecodable("The voice note arrived empty: please record it again.")
    limit = int(max_seconds * SAMPLE_RATE)
    chunks: list[bytes] = []
    count = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise NoteUndecodable("That file has no sound to transcribe: please send a voice note.")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunk = bytes(out.planes[0])[: out.samples * SAMPLE_WIDTH]
                    chunks.append(chunk)
                    count += out.samples
                if count > limit:
                    raise NoteTooLong(
                        f"The voice note is longer than {max_seconds:g} seconds, the most transcribed here: "
                        "please send a shorter one, or type the message."
                    )
            for out in resampler.resample(None):
                chunks.append(bytes(out.planes[0])[: out.samples * SAMPLE_WIDTH])
                count += out.samples
    except (av.error.FFmpegError, ValueError, IndexError, EOFError) as err:
        raise NoteUndecodable(
            "The voice note could not be read as audio (the file seems damaged): please record it again."
        ) from err
    if count > limit:
        raise NoteTooLong(
            f"The voice note is longer than {max_seconds:g} seconds, the most transcribed here: "
            "please send a shorter one, or type the message."
        )
    if count < MIN_SECONDS * SAMPLE_RATE:
        raise NoteUndecodable("The voice note holds no sound: please record it again.")
    return Pcm(samples=b"".join(chunks), seconds=count / SAMPLE_RATE)
