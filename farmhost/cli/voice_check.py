"""`farmhost doctor`'s voice line: which speech-to-text engine is configured, proved by loading or asking it."""

from __future__ import annotations

import asyncio
from typing import Final

from farmhost.cli.hostchecks import Check
from farmhost.config import VoiceSettings
from farmhost.voice import ModelNotFetched, VoiceError, speech_to_text
from farmhost.voice.embedded import EmbeddedEngine
from farmhost.voice.wyoming import WyomingEngine

# Loading whisper-base takes about a second; a named model is fetched on its first load (~150 MB for base).
VOICE_LIMIT: Final = 300.0
_FIX_OFF: Final = (
    "optional: set FARMHOST_STT_MODEL (e.g. base, or a model directory) or FARMHOST_STT_URL (a Wyoming server)"
)
_FIX_FETCH: Final = (
    "connect the farm computer to the internet, or set HF_ENDPOINT (and HTTPS_PROXY, SSL_CERT_FILE if needed) "
    "to a mirror it can reach, then run farmhost doctor again; or copy a model directory onto it and set "
    "FARMHOST_STT_MODEL to it (docs/voice.md)"
)


def voice(settings: VoiceSettings) -> Check:
    """The configured engine, loaded once (the embedded model) or asked what it serves (a Wyoming server)."""
    engine = speech_to_text(settings)
    if engine is None:
        return Check("voice", "off", "voice notes: off (FARMHOST_STT_MODEL and FARMHOST_STT_URL not set)", _FIX_OFF)
    try:
        proof = asyncio.run(_prove(engine))
    except ModelNotFetched as err:
        return Check("voice", "broken", f"voice notes: {engine.description}: {err}", _FIX_FETCH)
    except VoiceError as err:
        variable = "FARMHOST_STT_URL" if settings.url else "FARMHOST_STT_MODEL"
        return Check(
            "voice", "broken", f"voice notes: {engine.description}: {err}", f"check {variable} (docs/voice.md)"
        )
    return Check("voice", "ok", f"voice notes: {engine.description}, {proof}")


async def _prove(engine: object) -> str:
    if isinstance(engine, EmbeddedEngine):
        try:
            seconds = await engine.load()
        finally:
            await engine.aclose()
        return f"model loaded in {seconds:.1f} s (in a worker that ends when idle)"
    assert isinstance(engine, WyomingEngine)
    try:
        return f"the server offers {await engine.describe()}"
    finally:
        await engine.aclose()
