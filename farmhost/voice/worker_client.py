"""The client of the voice worker process (worker.py): it starts it, asks it, bounds each step, ends it when idle.

The worker starts with the first request; requests go to it one at a time, in arrival order, so a note that arrives
while the model loads waits for that one load. After FARMHOST_STT_IDLE_SECONDS without a request the worker ends and
its memory goes back to the farm. Every step of a request has a deadline: a worker past it is killed, and the next
request starts a fresh one. The embedded engine's worker holds the model; the Wyoming engine's only decodes notes
(FFmpeg's decoders parse untrusted files: in a process without the daemon's secrets, and killable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from farmhost.voice.audio import Pcm
from farmhost.voice.stt import (
    EngineUnavailable,
    ModelNotFetched,
    NoteTooLong,
    NoteUndecodable,
    TranscriptionTimeout,
    VoiceError,
    missing_extra,
)

if TYPE_CHECKING:
    from farmhost.config import VoiceSettings

logger = logging.getLogger(__name__)

# Python with PyAV and numpy starting on a Pi's SD card; and decoding a note of up to FARMHOST_STT_MAX_SECONDS.
START_TIMEOUT: Final = 60.0
DECODE_TIMEOUT: Final = 60.0
# Reading a few hundred MB of model from an SD card, or fetching a named model on a slow farm line the first time.
LOAD_TIMEOUT: Final = 600.0
# A note's transcription may take this + this many times its length: whisper-base at beam 1 took at most 0.3x the
# note's length on a shared 2-core x86 and is estimated at up to 0.8x on a Pi 5 (docs/performance.md); the rest is
# room for a busy CPU or a bigger model.
TRANSCRIBE_BASE: Final = 20.0
TRANSCRIBE_PER_SECOND: Final = 4.0
# A worker asked to end (stdin closed) that has not after this is killed.
EXIT_GRACE: Final = 5.0
# Answers are short JSON lines; a transcript of a long note is a few KB.
LINE_LIMIT: Final = 1 << 20
# What the worker inherits of the daemon's environment: it parses untrusted audio with FFmpeg's decoders, so it gets
# no token or key (HA_TOKEN, TELEGRAM_BOT_TOKEN, FARMHOST_LLM_API_KEY, nor HF_TOKEN), only what Python, CTranslate2
# and the download of a named model need: the Hub or its mirror (HF_ENDPOINT), huggingface_hub's own settings,
# proxies and CA certificates (docs/voice.md, "A model name").
WORKER_ENV: Final = frozenset({
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV", "XDG_CACHE_HOME", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "CT2_VERBOSE",
    "CT2_USE_EXPERIMENTAL_PACKED_GEMM",
    "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT",
    "HF_HUB_DISABLE_XET", "HF_HUB_DISABLE_TELEMETRY",
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})  # fmt: skip

# What the worker gets unless the daemon's environment says otherwise. CTranslate2's OpenMP threads spin while they
# wait for work by default: on a busy 2-core machine loading the model cost 0.65 CPU-s spinning against 0.36 s
# passive, for the same wall time or less, and a transcription the same (docs/voice.md).
WORKER_ENV_DEFAULTS: Final = {"OMP_WAIT_POLICY": "PASSIVE"}


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: WORKER_ENV_DEFAULTS, then what WORKER_ENV lets through of the daemon's `environ`."""
    return WORKER_ENV_DEFAULTS | {name: value for name, value in environ.items() if name in WORKER_ENV}


_ERRORS: Final[dict[str, type[VoiceError]]] = {
    cls.__name__: cls
    for cls in (VoiceError, NoteTooLong, NoteUndecodable, EngineUnavailable, ModelNotFetched, TranscriptionTimeout)
}


class VoiceWorker:
    """One worker process: with `model`, it decodes and transcribes; without, it only decodes."""

    def __init__(
        self,
        settings: VoiceSettings,
        *,
        model: str | None,
        transcribe_base: float = TRANSCRIBE_BASE,
        transcribe_per_second: float = TRANSCRIBE_PER_SECOND,
    ) -> None:
        self._settings = settings
        self._model = model
        self._base = transcribe_base
        self._per_second = transcribe_per_second
        self._lock = asyncio.Lock()
        self._proc: asyncio.subprocess.Process | None = None
        self._loaded = False
        self._last_used = 0.0
        self._idle: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()  # idle unloads
        self._reaping: set[asyncio.Task[None]] = set()  # killed workers not yet waited for
        self._closed = False
        self.loads = 0  # how often the model was loaded (a fresh worker loads it again)

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def transcribe(self, audio: bytes) -> dict[str, Any]:
        """The worker's answer for one note: text, language, seconds."""
        answer, _ = await self._ask({"op": "transcribe", "size": len(audio)}, audio)
        return answer

    async def decode(self, audio: bytes) -> Pcm:
        """The note as 16 kHz mono PCM, decoded and length-checked in the worker."""
        answer, samples = await self._ask({"op": "decode", "size": len(audio)}, audio)
        return Pcm(samples=samples, seconds=float(answer["seconds"]))

    async def load(self) -> float:
        """Start the worker and load the model now (the doctor's proof); the seconds it took, ~0 if loaded."""
        started = time.monotonic()
        await self._ask({"op": "load"}, b"")
        return time.monotonic() - started

    async def aclose(self) -> None:
        """End the worker at once (a note being transcribed gets EngineUnavailable); idempotent."""
        self._closed = True
        self._cancel_idle()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._kill()
        await asyncio.gather(*self._reaping, return_exceptions=True)

    async def _ask(self, request: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        if self._closed:
            raise EngineUnavailable("Voice notes are not transcribed while farmhost stops: send it again in a minute.")
        if (missing := missing_extra(*(("faster_whisper", "av") if self._model else ("av",)))) is not None:
            raise missing
        async with self._lock:
            self._cancel_idle()
            try:
                return await self._exchange(request, payload)
            finally:
                self._last_used = time.monotonic()
                self._arm_idle()

    async def _exchange(self, request: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        proc = await self._worker()
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request).encode() + b"\n" + payload)
            await asyncio.wait_for(proc.stdin.drain(), DECODE_TIMEOUT)
            return await self._answer(proc, request["op"])
        except VoiceError:  # the worker's own answer: it is ready for the next note
            raise
        except TimeoutError:
            await self._kill()
            raise TranscriptionTimeout(
                "Transcribing the voice note took too long and was stopped: send a shorter note, or type the message."
            ) from None
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError) as err:  # a dead worker, a garbled line
            await self._kill()
            logger.warning("speech-to-text worker failed: %r", err)
            raise EngineUnavailable(
                "The speech-to-text engine stopped unexpectedly: send the note again, and if it fails again "
                "run `farmhost doctor` on the farm computer."
            ) from err
        except BaseException:  # cancelled mid-request: the worker's answers are out of step now
            self._kill_now()
            raise

    async def _answer(self, proc: asyncio.subprocess.Process, op: str) -> tuple[dict[str, Any], bytes]:
        deadline = time.monotonic() + DECODE_TIMEOUT
        seconds = 0.0
        while True:
            event = await self._read(proc, deadline)
            kind = event.get("event")
            if kind == "decoded":
                seconds = float(event["seconds"])
                deadline = time.monotonic() + self._budget(seconds)
            elif kind == "loading":
                deadline = time.monotonic() + LOAD_TIMEOUT
            elif kind == "downloading":  # a named model not in <data>/models yet: fetched once, then kept
                logger.info("speech-to-text model %s is being downloaded from %s into %s", self._model,
                            event.get("endpoint"), event.get("into"))  # fmt: skip
                deadline = time.monotonic() + LOAD_TIMEOUT
            elif kind == "loaded":
                self.loads += 1
                self._loaded = True
                logger.info("speech-to-text model %s loaded in %.1f s", self._model, event.get("seconds", 0))
                deadline = time.monotonic() + (self._budget(seconds) if op == "transcribe" else DECODE_TIMEOUT)
            elif kind == "error":
                raise _ERRORS.get(str(event.get("kind")), VoiceError)(str(event.get("message")))
            elif kind == "pcm":
                assert proc.stdout is not None
                remaining = max(0.0, deadline - time.monotonic())
                return event, await asyncio.wait_for(proc.stdout.readexactly(int(event["size"])), remaining)
            elif kind == "done" or (kind == "ready" and op == "load"):
                return event, b""

    def _budget(self, seconds: float) -> float:
        return self._base + self._per_second * seconds

    @staticmethod
    async def _read(proc: asyncio.subprocess.Process, deadline: float) -> dict[str, Any]:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, deadline - time.monotonic()))
        if not line:
            raise EOFError(f"the worker ended (exit status {await proc.wait()})")
        event = json.loads(line)
        if not isinstance(event, dict):
            raise ValueError(f"not an answer: {line[:200]!r}")  # noqa: TRY004 - a garbled line, as bad JSON is
        return event

    async def _worker(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        settings = self._settings
        argv = [sys.executable, "-m", "farmhost.voice.worker", "--max-seconds", str(settings.max_seconds)]
        if self._model is not None:
            argv += ["--model", self._model]
        if settings.language:
            argv += ["--language", settings.language]
        argv += ["--download-root", str(settings.models_dir), "--threads", str(min(4, os.cpu_count() or 1))]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT,
                env=worker_env(os.environ),
                start_new_session=True,  # a Ctrl-C meant for the daemon does not hit the worker mid-note
            )
        except OSError as err:
            raise EngineUnavailable(
                f"The speech-to-text worker could not start ({err.strerror}): run `farmhost doctor` on the farm computer."
            ) from err
        self._proc = proc
        self._loaded = False
        try:
            event = await self._read(proc, time.monotonic() + START_TIMEOUT)
        except (TimeoutError, EOFError, ValueError, OSError) as err:
            await self._kill()
            raise EngineUnavailable(
                "The speech-to-text worker did not start: run `farmhost doctor` on the farm computer."
            ) from err
        if event.get("event") != "started":
            await self._kill()
            raise EngineUnavailable(
                "The speech-to-text worker did not start: run `farmhost doctor` on the farm computer."
            )
        logger.info("speech-to-text worker %d started (%s)", proc.pid, self._model or "decoding only")
        return proc

    def _arm_idle(self) -> None:
        if self._closed or self._proc is None:
            return
        self._idle = asyncio.get_running_loop().call_later(self._settings.idle_seconds, self._on_idle)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _on_idle(self) -> None:
        self._idle = None
        task = asyncio.get_running_loop().create_task(self._unload())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _unload(self) -> None:
        async with self._lock:
            if time.monotonic() - self._last_used < self._settings.idle_seconds:
                return  # a note came while this waited for the lock: its own timer follows
            proc = self._proc
            if proc is None:
                return
            assert proc.stdin is not None
            proc.stdin.close()  # the worker ends when its requests end
            try:
                await asyncio.wait_for(proc.wait(), EXIT_GRACE)
            except TimeoutError:
                proc.kill()
                await proc.wait()
            self._proc = None  # only now: an unload cancelled half-way leaves the worker for aclose() to kill
            logger.info("speech-to-text worker %d ended after %g s idle", proc.pid, self._settings.idle_seconds)

    def _kill_now(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        task = asyncio.get_running_loop().create_task(self._reap(proc))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await self._reap(proc)

    @staticmethod
    async def _reap(proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
