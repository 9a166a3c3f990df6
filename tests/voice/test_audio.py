"""Decoding notes with PyAV: each kind Telegram delivers, to 16 kHz mono, with the length limit and bad files."""

from __future__ import annotations

import numpy as np
import pytest

from farmhost.voice import NoteTooLong, NoteUndecodable
from farmhost.voice.audio import SAMPLE_RATE, SAMPLE_WIDTH, decode
from farmhost_dev.voice import FORMATS, encode_note, tone_note


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_each_kind_of_note_becomes_16_khz_mono(kind: str) -> None:
    pcm = decode(tone_note(4.0, rate=44_100, kind=kind), max_seconds=120)
    assert 3.9 < pcm.seconds < 4.2  # encoders add a few ms of priming
    assert len(pcm.samples) == round(pcm.seconds * SAMPLE_RATE) * SAMPLE_WIDTH
    level = np.abs(np.frombuffer(pcm.samples, dtype=np.int16)).max()
    assert 1500 < level < 6000  # the tone, not silence or noise (it was written at 3000)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_the_limit_holds_in_every_kind(kind: str) -> None:
    with pytest.raises(NoteTooLong, match="longer than 3 seconds"):
        decode(tone_note(4.0, kind=kind), max_seconds=3)


def test_a_video_without_sound_says_so() -> None:
    with pytest.raises(NoteUndecodable, match="no sound"):
        decode(encode_note(np.zeros(0, dtype=np.int16), SAMPLE_RATE, "mp4", video=True), max_seconds=120)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 4096,
        b"OggS" + bytes(range(256)) * 4,
        b"ID3\x03\x00\x00\x00" + b"\xff" * 3000,
        b"%PDF-1.7\n",
        b"ffconcat version 1.0\nfile note.ogg\n",  # a playlist: it would make the decoder open another file
        b"#EXTM3U\n#EXTINF:1,\nnote.ogg\n",
        b"RIFF\x24\x00\x00\x00WAVEfmt ",  # only the containers a note comes in are opened
    ],
    ids=["empty", "zeros", "ogg-garbage", "mp3-garbage", "pdf", "ffconcat", "hls", "wav"],
)
def test_what_is_not_audio_is_undecodable_with_one_sentence(data: bytes) -> None:
    with pytest.raises(NoteUndecodable) as refused:
        decode(data, max_seconds=120)
    message = str(refused.value)
    assert message.endswith(": please record it again.") and "\n" not in message


def test_a_truncated_note_is_undecodable_or_shorter() -> None:
    note = tone_note(4.0)
    try:
        pcm = decode(note[: len(note) // 2], max_seconds=120)
    except NoteUndecodable:
        return
    assert pcm.seconds < 4.0
