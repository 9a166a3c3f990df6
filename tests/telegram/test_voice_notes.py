"""voice_notes: a transcript becomes the row's text whole (a long note is not cut), refusals keep the placeholder."""

from __future__ import annotations

from farmhost.telegram.inbound.media import MediaRef
from farmhost.telegram.inbound.voice_notes import hear, quote, spoken_words
from farmhost.voice.stt import NoteTooLong, Transcript

SAVED = "[voice: inbox/2026-12-06T10-00-00-voice-7.ogg]"
NOTE = MediaRef(kind="voice", file_id="f")


class Engine:
    """An engine that says what it was built to say (the engines themselves are tested in tests/voice)."""

    description = "a fixed engine"

    def __init__(self, text: str | None) -> None:
        self.text = text

    async def transcribe(self, audio: bytes) -> Transcript:
        if self.text is None:
            raise NoteTooLong("The voice note is longer than 120 seconds, the most transcribed here.")
        return Transcript(text=self.text, language="en", seconds=110.0, engine="fixed")

    async def aclose(self) -> None:
        return None


async def test_a_long_transcript_is_kept_whole_and_only_the_reply_quote_is_cut() -> None:
    words = " ".join(f"water row {n} of the north field" for n in range(80))  # ~2,600 characters
    heard = await hear(Engine(words), NOTE, SAVED, b"audio", "")
    assert heard.words == words and heard.body == f"{SAVED} 🎤 {words}"
    assert spoken_words(heard.body) == words
    assert len(quote(words)) < 310 and quote(words).endswith("…")


async def test_a_refused_note_keeps_its_placeholder_and_says_why() -> None:
    heard = await hear(Engine(None), NOTE, SAVED, b"audio", "the caption")
    assert heard.words is None and spoken_words(heard.body) is None
    assert heard.body == "[voice: inbox/2026-12-06T10-00-00-voice-7.ogg (not transcribed)]\nthe caption"
    assert heard.refusal == "🎤 The voice note is longer than 120 seconds, the most transcribed here."
    assert heard.text == "the caption"  # routing reads the caption only


async def test_nothing_saved_means_nothing_heard() -> None:
    heard = await hear(Engine("never asked"), NOTE, "[voice: (not saved: 25 MB is over the 20 MB limit)]", None, "")
    assert heard.words is None and heard.refusal is not None and "could not fetch" in heard.refusal
