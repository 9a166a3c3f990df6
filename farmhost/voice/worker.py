"""The embedded engine's worker process: decodes notes and runs faster-whisper, one request at a time.

Run as `python -m farmhost.voice.worker [--model MODEL]` by `VoiceWorker` (worker_client.py). A process, not a thread: the model's few hundred
MB go back to the system when it ends, and a stuck transcription can be killed. Requests come on stdin as one JSON
line (`{"op": "load"}`, or `{"op": "transcribe" | "decode", "size": N}` followed by N bytes of the note); answers go out as JSON
lines on the original stdout (libraries that print are sent to stderr): `decoded` (the note's length, before any
model work), `loading`, `downloading` (a named model fetched once), `loaded`, then `done` or `error` (the VoiceError subclass and its sentence); a decode
is answered by `pcm` (length and size) followed by that many bytes of 16 kHz mono PCM.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from farmhost.voice.audio import SAMPLE_RATE, decode
from farmhost.voice.stt import EngineUnavailable, ModelNotFetched, VoiceError, missing_extra, one_line

if TYPE_CHECKING:
    from faster_whisper import WhisperModel

# Below the daemon: a note being transcribed must not slow the event loop that answers the farm.
NICENESS = 5
# glibc's mallopt: the size from which an allocation is its own mmap, given back to the system when freed.
M_MMAP_THRESHOLD = -3
# 1 MiB instead of glibc's sliding threshold, which rises to 32 MiB after the model's load frees its big buffers:
# then each note's spectrogram, attention and VAD buffers come from the heap, which keeps what they freed and
# fragments, and the peak grew with the note (455 MB for 107 s). Fixed, it is 350-360 MB for any note up to 2 minutes
# (the model's load peaks at ~335 MB), for ~15% more CPU time (fresh pages from the kernel). docs/performance.md.
MMAP_THRESHOLD = 1 << 20


def libc() -> ctypes.CDLL | None:
    """The C library's allocator functions, or None where they cannot be reached."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_heap() -> None:
    """Big buffers as their own mappings (MMAP_THRESHOLD); a C library without mallopt is left as it is."""
    if (lib := libc()) is not None and hasattr(lib, "mallopt"):
        lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim_heap() -> None:
    """Give the heap's free pages back after a note (glibc only): the worker then waits at its loaded size."""
    if (lib := libc()) is not None and hasattr(lib, "malloc_trim"):
        lib.malloc_trim(0)


class Worker:
    """One model, loaded on the first request that needs it."""

    def __init__(self, args: argparse.Namespace, out: IO[bytes]) -> None:
        self.args = args
        self.out = out
        self.model: WhisperModel | None = None

    def send(self, **event: Any) -> None:
        """One answer line."""
        self.out.write(json.dumps(event).encode() + b"\n")
        self.out.flush()

    def load(self) -> WhisperModel:
        """The model, loaded now if it is not yet."""
        if self.model is not None:
            return self.model
        if self.args.model is None:
            raise EngineUnavailable("This speech-to-text worker has no model: set FARMHOST_STT_MODEL.")
        if (missing := missing_extra("faster_whisper", "ctranslate2")) is not None:
            raise missing
        self.send(event="loading")
        started = time.monotonic()
        from farmhost.voice.whisper_model import OneEncodePerWindow

        is_dir = os.path.isdir(self.args.model)
        if not is_dir and self.args.model.startswith(("/", ".", "~")):
            raise EngineUnavailable(
                f"The speech-to-text model directory {self.args.model} does not exist: "
                "fix FARMHOST_STT_MODEL on the farm computer."
            )
        path = self.args.model if is_dir else self.fetch(self.args.model)
        try:
            self.model = OneEncodePerWindow(
                path, device="cpu", compute_type="int8", cpu_threads=self.args.threads, num_workers=1
            )
        except Exception as err:
            print(f"farmhost.voice.worker: cannot load {self.args.model}: {err!r}", file=sys.stderr)
            raise EngineUnavailable(
                f"The speech-to-text model {self.args.model} could not be loaded ({type(err).__name__}): "
                "check FARMHOST_STT_MODEL with `farmhost doctor`."
            ) from err
        self.send(event="loaded", seconds=round(time.monotonic() - started, 3))
        return self.model

    def fetch(self, name: str) -> str:
        """The directory of the model `name` in the download root: the copy there, else downloaded now, once.

        A copy already there is used without asking the Hub (a farm whose line is down still hears its notes, and a
        start never waits on the network); only a model not there yet is fetched, from HF_ENDPOINT (the Hub unless
        set), through the proxies and CA bundle in the environment, into the Hub's cache layout under the root.
        """
        from faster_whisper.utils import available_models, download_model
        from huggingface_hub import constants

        if "/" not in name and name not in available_models():
            raise EngineUnavailable(
                f"FARMHOST_STT_MODEL={name} is neither a model directory nor a model name faster-whisper knows "
                "(tiny, base, small, base.en, ...): fix FARMHOST_STT_MODEL on the farm computer."
            )
        root = self.args.download_root
        try:
            return str(download_model(name, cache_dir=root, local_files_only=True))
        except OSError:  # not there yet, or half there (LocalEntryNotFoundError): downloaded, or completed, now
            pass
        self.send(event="downloading", endpoint=constants.ENDPOINT, into=root)
        try:
            return str(download_model(name, cache_dir=root))
        except Exception as err:
            print(f"farmhost.voice.worker: cannot download {name}: {err!r}", file=sys.stderr)
            if _named(err, "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
                raise EngineUnavailable(
                    f"The speech-to-text model {name} is not offered by {constants.ENDPOINT}: "
                    "fix FARMHOST_STT_MODEL (a model name such as base, or a model directory)."
                ) from err
            raise ModelNotFetched(
                f"The speech-to-text model {name} is not on the farm computer yet and could not be downloaded from "
                f"{constants.ENDPOINT} ({_why(err, root)}): connect the farm computer to the internet (or set "
                "HF_ENDPOINT to a mirror it can reach) and run `farmhost doctor`, or set FARMHOST_STT_MODEL to a "
                "model directory."
            ) from err

    def transcribe(self, data: bytes) -> None:
        """Decode, check the length, load if needed, transcribe; each step answered as it ends."""
        import numpy as np

        pcm = decode(data, max_seconds=self.args.max_seconds)
        self.send(event="decoded", seconds=pcm.seconds)
        model = self.load()
        audio = np.frombuffer(pcm.samples, dtype=np.int16).astype(np.float32) / 32768.0
        started = time.monotonic()
        segments, info = model.transcribe(
            audio,
            language=self.args.language,
            beam_size=1,
            # Silence in, nothing out: without the VAD Whisper "hears" stock phrases in a silent note.
            vad_filter=True,
            condition_on_previous_text=False,
        )
        text = one_line(" ".join(segment.text for segment in segments))
        self.send(
            event="done",
            text=text,
            language=info.language,
            seconds=pcm.seconds,
            took=round(time.monotonic() - started, 3),
        )

    def serve(self, stdin: IO[bytes]) -> None:
        """Answer requests until stdin closes."""
        while line := stdin.readline():
            request = json.loads(line)
            try:
                if request["op"] == "load":
                    self.load()
                    self.send(event="ready")
                elif request["op"] == "decode":
                    pcm = decode(stdin.read(int(request["size"])), max_seconds=self.args.max_seconds)
                    self.send(event="pcm", seconds=pcm.seconds, size=len(pcm.samples))
                    self.out.write(pcm.samples)
                    self.out.flush()
                else:
                    data = stdin.read(int(request["size"]))
                    self.transcribe(data)
            except VoiceError as err:
                self.send(event="error", kind=type(err).__name__, message=str(err))
            trim_heap()


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the errors it was raised from."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _named(err: BaseException, *names: str) -> bool:
    """Whether `err` or an error it came from is of a class called one of `names`.

    By name: huggingface_hub's errors and those of its HTTP library (which library that is has changed between its
    versions) are not imported for a check.
    """
    return any(cls.__name__ in names for cause in _chain(err) for cls in type(cause).__mro__)


def _why(err: BaseException, root: str) -> str:
    """Why a download failed, in a few words."""
    if _named(err, "OfflineModeIsEnabled"):
        return "HF_HUB_OFFLINE is set"
    if _named(err, "ProxyError"):
        return "the proxy refused"
    if _named(err, "TimeoutException", "Timeout", "TimeoutError"):
        return "it did not answer in time"
    if _named(err, "ConnectError", "ConnectionError", "TransportError", "NetworkError"):
        return "it could not be reached"
    for cause in _chain(err):
        response = getattr(cause, "response", None)
        if (status := getattr(response, "status_code", None)) is not None:
            return f"it answered HTTP {status}"
    for cause in _chain(err):
        if isinstance(cause, PermissionError | IsADirectoryError | NotADirectoryError) or (
            isinstance(cause, OSError) and cause.errno is not None and getattr(cause, "filename", None)
        ):
            return f"{root} could not be written: {cause.strerror}"
    return type(err).__name__


def main() -> None:
    """Serve the daemon on stdin/stdout."""
    parser = argparse.ArgumentParser(prog="python -m farmhost.voice.worker")
    parser.add_argument("--model", default=None, help="none: the worker only decodes")
    parser.add_argument("--language", default=None)
    parser.add_argument("--max-seconds", type=float, required=True)
    parser.add_argument("--download-root", default=None)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a library's print never corrupts the answers
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    limit_heap()
    worker = Worker(args, out)
    try:
        worker.send(event="started", pid=os.getpid(), rate=SAMPLE_RATE)
        worker.serve(sys.stdin.buffer)
    except BrokenPipeError:  # the daemon is gone (a kill -9): nobody is left to answer, and nothing to report
        os._exit(0)  # no flush at exit, which would only hit the broken pipe again


if __name__ == "__main__":
    main()
