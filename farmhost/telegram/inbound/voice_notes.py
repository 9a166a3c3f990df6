"""Voice notes in a chat: heard on the farm, then handled as the farmer's typed words.

A voice note, an audio file or a video note in a registered chat is fetched into the group's inbox (media.py) and,
when speech-to-text is configured (farmhost.voice), transcribed before the message is routed, so a spoken trigger
word counts like a typed one. The transcript row then reads `[voice: inbox/<file>] 🎤 <the words>`, the caption (if any) on
the next line: marked as voice, searchable, and the agent (or Assist) gets the words. The reply to such a message starts with
`🎤 <the words>` so a misheard command is seen before it matters.

A note that is not transcribed (too long, undecodable, the engine unavailable, nothing said) is stored with its
placeholder and the reason, the audio stays in the inbox, and the chat is told in one sentence; nothing runs.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Final

from farmhost.outbox.text import one_line
from farmhost.telegram.inbound.media import MediaRef
from farmhost.voice.stt import SpeechToText, VoiceError

logger = logging.getLogger(__name__)

VOICE_KINDS: Final = frozenset({"voice", "audio", "video_note"})
MARK: Final = "🎤"
# The words quoted back at the top of a reply are cut here; the transcript keeps them whole.
QUOTE_CHARS: Final = 300
# A note of FARMHOST_STT_MAX_SECONDS (120 s) is ~2,000 characters of words; this only bounds a runaway engine.
WORDS_CHARS: Final = 20_000
# A note that arrives while too many updates wait for earlier notes (chat_queues.py) is kept but not heard.
BUSY: Final = (
    "The farm computer is busy hearing earlier voice notes, so I did not hear this one. "
    "Please send it again in a few minutes, or type it."
)
_HEARD_RE: Final = re.compile(r"\[(?:voice|audio|video_note): [^\]\n]*\] " + MARK + r" (?P<words>[^\n]+)")


@dataclass(frozen=True, kw_only=True)
class Heard:
    """A voice note after the engine: its transcript row's text, and the words or the reason there are none."""

    body: str  # the transcript row's text: placeholder, mark and words; the caption on the next line
    words: str | None  # what was understood (None: not transcribed)
    caption: str = ""
    refusal: str | None = None  # the sentence the chat is told when it was not transcribed

    @property
    def text(self) -> str:
        """The message as if it had been typed: the words, then the caption (what routing reads)."""
        return "\n".join(part for part in (self.words, self.caption) if part)


def is_voice(ref: MediaRef | None) -> bool:
    """Whether the media is speech to transcribe."""
    return ref is not None and ref.kind in VOICE_KINDS


async def hear(stt: SpeechToText, ref: MediaRef, saved: str, data: bytes | None, caption: str) -> Heard:
    """Transcribe a saved note; `saved` is its placeholder, `data` its bytes (None: it was not saved)."""
    if data is None:
        return refused(saved, caption, "I could not fetch this voice note from Telegram, so I did not hear it.")
    try:
        transcript = await stt.transcribe(data)
    except VoiceError as err:
        logger.info("voice: a %s was not transcribed: %s", ref.kind, err)
        return refused(saved, caption, str(err))
    words = one_line(transcript.text, WORDS_CHARS)
    if not words:
        return refused(saved, caption, "I heard nothing I could make into words in this voice note.")
    logger.info("voice: a %.1f s %s transcribed by %s (%s)", transcript.seconds, ref.kind, transcript.engine,
                transcript.language or "language unknown")  # fmt: skip
    return Heard(body=_lines(f"{saved} {MARK} {words}", caption), words=words, caption=caption)


def spoken_words(text: str) -> str | None:
    """The words of a transcribed note from its transcript row's text (None for any other message)."""
    found = _HEARD_RE.match(text)
    if found is None:
        return None
    words = found["words"].strip()
    return words or None


def quote(words: str) -> str:
    """The first line of a reply to a voice note: what was understood."""
    return f"{MARK} {one_line(words, QUOTE_CHARS)}"


def refused(saved: str, caption: str, reason: str) -> Heard:
    """A note that is not transcribed: the placeholder says so, the chat is told `reason`."""
    note = saved[:-1] + " (not transcribed)]" if saved.endswith("]") else saved
    return Heard(body=_lines(note, caption), words=None, caption=caption, refusal=f"{MARK} {reason}")


def _lines(first: str, caption: str) -> str:
    return f"{first}\n{caption}" if caption else first
