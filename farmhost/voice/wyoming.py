"""The Wyoming engine: notes decoded here, their PCM sent to a Wyoming speech-to-text server (FARMHOST_STT_URL).

One connection per note (a Wyoming server such as wyoming-faster-whisper answers one transcription per
connection); the note's length is checked before anything is sent. Decoding runs in a worker process without a
model (worker_client.py): off the event loop, bounded in time, and away from the daemon's secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from farmhost.voice.audio import SAMPLE_RATE, SAMPLE_WIDTH
from farmhost.voice.stt import EngineUnavailable, Transcript, TranscriptionTimeout, missing_extra, one_line
from farmhost.voice.worker_client import TRANSCRIBE_BASE, TRANSCRIBE_PER_SECOND, VoiceWorker

if TYPE_CHECKING:
    from farmhost.config import VoiceSettings

# A server on the farm's own network answers a connection at once; longer means it is not there.
CONNECT_TIMEOUT: Final = 5.0
# 100 ms of audio per chunk, as Wyoming satellites send it.
CHUNK_BYTES: Final = SAMPLE_RATE // 10 * SAMPLE_WIDTH


class WyomingEngine:
    """A Wyoming server's speech-to-text, reached over TCP."""

    def __init__(self, settings: VoiceSettings, *, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        if settings.url is None:
            raise ValueError("WyomingEngine needs FARMHOST_STT_URL")
        self._settings = settings
        self._url = settings.url
        self._connect_timeout = connect_timeout
        self._decoder = VoiceWorker(settings, model=None)

    @property
    def description(self) -> str:
        """The engine and its server."""
        return f"wyoming {self._url}"

    @property
    def worker_pid(self) -> int | None:
        """The decoding worker's process id while it runs."""
        return self._decoder.worker_pid

    async def transcribe(self, audio: bytes) -> Transcript:
        """The words of one note, from the server."""
        if (missing := missing_extra("wyoming", "av")) is not None:
            raise missing
        pcm = await self._decoder.decode(audio)
        from wyoming.asr import Transcribe
        from wyoming.asr import Transcript as WyomingTranscript
        from wyoming.audio import AudioChunk, AudioStart, AudioStop

        language = self._settings.language
        client = await self._connect()
        try:
            async with asyncio.timeout(TRANSCRIBE_BASE + TRANSCRIBE_PER_SECOND * pcm.seconds):
                await client.write_event(Transcribe(language=language).event())
                await client.write_event(AudioStart(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=1).event())
                for start in range(0, len(pcm.samples), CHUNK_BYTES):
                    chunk = pcm.samples[start : start + CHUNK_BYTES]
                    await client.write_event(
                        AudioChunk(rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=1, audio=chunk).event()
                    )
                await client.write_event(AudioStop().event())
                while (event := await client.read_event()) is not None:
                    if WyomingTranscript.is_type(event.type):
                        said = WyomingTranscript.from_event(event)
                        return Transcript(
                            text=one_line(said.text),
                            language=said.language or language,
                            seconds=pcm.seconds,
                            engine=self.description,
                        )
        except TimeoutError:
            raise TranscriptionTimeout(
                f"The speech-to-text server at {self._url} took too long over the voice note: "
                "send a shorter note, or type the message."
            ) from None
        except OSError as err:
            raise self._unavailable(err) from err
        finally:
            await _disconnect(client)
        raise EngineUnavailable(
            f"The speech-to-text server at {self._url} closed the connection without a transcript: "
            "check that it is a speech-to-text (ASR) server, and send the note again."
        )

    async def describe(self) -> str:
        """The server's speech-to-text programs and models, asked over Wyoming (the doctor's proof)."""
        if (missing := missing_extra("wyoming")) is not None:
            raise missing
        from wyoming.info import Describe, Info

        client = await self._connect()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await client.write_event(Describe().event())
                while (event := await client.read_event()) is not None:
                    if Info.is_type(event.type):
                        info = Info.from_event(event)
                        models = [m.name for program in info.asr for m in program.models]
                        if not models:
                            raise EngineUnavailable(
                                f"The Wyoming server at {self._url} offers no speech-to-text: "
                                "point FARMHOST_STT_URL at an ASR server such as wyoming-faster-whisper."
                            )
                        return ", ".join(models)
        except (TimeoutError, OSError) as err:
            raise self._unavailable(err) from err
        finally:
            await _disconnect(client)
        raise self._unavailable(EOFError("it closed the connection"))

    async def aclose(self) -> None:
        """End the decoding worker; no connection is held between notes."""
        await self._decoder.aclose()

    async def _connect(self) -> AsyncTcpClient:
        from wyoming.client import AsyncTcpClient

        host, port = self._settings.host_port
        client = AsyncTcpClient(host, port)
        try:
            await asyncio.wait_for(client.connect(), self._connect_timeout)
        except (OSError, TimeoutError) as err:
            raise self._unavailable(err) from err
        return client

    def _unavailable(self, err: BaseException) -> EngineUnavailable:
        if isinstance(err, ConnectionRefusedError):
            reason = "nothing listens there"
        elif isinstance(err, TimeoutError):
            reason = "no answer"
        else:
            reason = str(err) or type(err).__name__
        return EngineUnavailable(
            f"The speech-to-text server at {self._url} cannot be reached ({reason}): start it, or fix "
            "FARMHOST_STT_URL on the farm computer."
        )


async def _disconnect(client: AsyncTcpClient) -> None:
    with contextlib.suppress(OSError):
        await client.disconnect()


if TYPE_CHECKING:
    from wyoming.client import AsyncTcpClient
