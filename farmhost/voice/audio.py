"""Decoding a note (OGG/Opus, MP3, M4A, the sound of an MP4 video note) to 16 kHz mono PCM with PyAV.

Blocking and CPU-bound: the embedded engine calls it in its worker process, the Wyoming engine in a thread. The
length is counted from the decoded samples (a container's header may lie), and decoding stops as soon as the note
is over the limit, so a long or hostile file costs at most `max_seconds` of decoding.

What a chat sends is hostile: the container is told from the file's first bytes and only those four are opened,
with FFmpeg's demuxer named (`CONTAINERS`). Probing would also accept playlists (`concat`, `hls`) that make the
decoder open other files, such as another group's voice notes. A frame's length is counted at its own rate before
it is resampled, so a note that declares a tiny sample rate cannot turn a few KB into gigabytes of 16 kHz samples.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

from farmhost.voice.stt import NoteTooLong, NoteUndecodable, missing_extra

SAMPLE_RATE: Final = 16_000  # what Whisper listens at, and what a Wyoming server is sent
SAMPLE_WIDTH: Final = 2  # 16-bit signed little-endian samples
# Decoded audio below this is not a voice note (a click, a header without sound).
MIN_SECONDS: Final = 0.1
# Below this a stream is no recording of a voice (telephone speech is 8 kHz): refused before it is resampled.
MIN_SAMPLE_RATE: Final = 8_000
# The containers a note comes in (OGG/Opus voice notes, MP3 and M4A audio files, MP4 video notes), each told by
# its first bytes, and the FFmpeg demuxer that opens it.
CONTAINERS: Final = ("ogg", "mp3", "mp4")
_MP4_BOXES: Final = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide")
NOT_A_NOTE: Final = "That file is not a recording farmhost can read (a voice note, an MP3 or an M4A audio file): please record it again."


@dataclass(frozen=True)
class Pcm:
    """A decoded note: 16 kHz mono 16-bit samples and its length."""

    samples: bytes
    seconds: float


def decode(data: bytes, *, max_seconds: float) -> Pcm:
    """The note's sound as 16 kHz mono PCM.

    Raises:
        NoteUndecodable: empty, corrupt, not audio (or not in one of CONTAINERS), a sample rate under
            MIN_SAMPLE_RATE, or silent for less than a tenth of a second.
        NoteTooLong: more than `max_seconds` of sound.
        EngineUnavailable: PyAV (of the `voice` extra) is not installed.
    """
    if (missing := missing_extra("av")) is not None:
        raise missing
    import av

    if not data:
        raise NoteUndecodable("The voice note arrived empty: please record it again.")
    container_format = container_of(data)
    if container_format is None:
        raise NoteUndecodable(NOT_A_NOTE)
    try:
        with av.open(io.BytesIO(data), mode="r", format=container_format) as container:
            if not container.streams.audio:
                raise NoteUndecodable("That file has no sound to transcribe: please send a voice note.")
            chunks, count = _resampled(av, container, max_seconds)
    except (av.error.FFmpegError, ValueError, IndexError, EOFError) as err:
        raise NoteUndecodable(
            "The voice note could not be read as audio (the file seems damaged): please record it again."
        ) from err
    if count > int(max_seconds * SAMPLE_RATE):
        raise _too_long(max_seconds)
    if count < MIN_SECONDS * SAMPLE_RATE:
        raise NoteUndecodable("The voice note holds no sound: please record it again.")
    return Pcm(samples=b"".join(chunks), seconds=count / SAMPLE_RATE)


def _resampled(av: Any, container: Any, max_seconds: float) -> tuple[list[bytes], int]:
    """The first audio stream's samples at 16 kHz mono, stopped as soon as it is over `max_seconds`."""
    limit = int(max_seconds * SAMPLE_RATE)
    chunks: list[bytes] = []
    count = 0
    heard = 0.0  # seconds decoded, each frame counted at its own rate before it is resampled
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    for frame in container.decode(container.streams.audio[0]):
        if frame.sample_rate < MIN_SAMPLE_RATE:
            raise NoteUndecodable(NOT_A_NOTE)
        heard += frame.samples / frame.sample_rate
        if heard > max_seconds:
            raise _too_long(max_seconds)
        for out in resampler.resample(frame):
            chunks.append(bytes(out.planes[0])[: out.samples * SAMPLE_WIDTH])
            count += out.samples
        if count > limit:
            raise _too_long(max_seconds)
    for out in resampler.resample(None):
        chunks.append(bytes(out.planes[0])[: out.samples * SAMPLE_WIDTH])
        count += out.samples
    return chunks, count


def _too_long(max_seconds: float) -> NoteTooLong:
    return NoteTooLong(
        f"The voice note is longer than {max_seconds:g} seconds, the most transcribed here: "
        "please send a shorter one, or type the message."
    )


def container_of(data: bytes) -> str | None:
    """The FFmpeg demuxer for a note's first bytes (one of CONTAINERS), or None for anything else."""
    if data.startswith(b"OggS"):
        return "ogg"
    if data[4:8] in _MP4_BOXES:
        return "mp4"
    if data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None
