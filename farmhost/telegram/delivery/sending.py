"""One outbox entry -> one Bot API message: its form (HTML or plain text, photo or document) and the fallbacks.

When Telegram refuses the richer form, the same entry goes again at once in the plainer one: any 400 on HTML
(except "chat not found") -> plain text; a photo Telegram cannot process -> a document. The new options are
handed to `remember` (which stores them) before that send, so a retry after a crash never flips back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from telegram import InlineKeyboardMarkup, Message, ReplyParameters
from telegram.error import BadRequest

from farmhost.outbox.chunking import TELEGRAM_TEXT_LIMIT
from farmhost.telegram.bot import chat_id_of
from farmhost.telegram.delivery.formatting import TELEGRAM_CAPTION_LIMIT, render

if TYPE_CHECKING:
    from telegram import Bot

    from farmhost.store.outbox import OutboxEntry

logger = logging.getLogger(__name__)

PHOTO_SUFFIXES: Final = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif"})
# sendPhoto's limit; a bigger picture goes as a document.
PHOTO_MAX_BYTES: Final = 10 * 1024 * 1024
# The one 400 that is about the chat, not the text: no point in sending it again as plain text.
_CHAT_NOT_FOUND: Final = "chat not found"


class Undeliverable(Exception):
    """This entry can never be sent (not a Telegram chat, a bad keyboard, a missing file); fail it at once."""


@dataclass(frozen=True, kw_only=True)
class Delivered:
    """A send Telegram confirmed."""

    message: Message
    transcript_text: str  # the chunk as written; for a file a `[photo name]` placeholder and the caption


async def send_entry(
    bot: Bot,
    entry: OutboxEntry,
    *,
    files_root: Path,
    remember: Callable[[dict[str, Any]], None],
    reply_to: int | None = None,
) -> Delivered:
    """Send one outbox entry, falling back to a plainer form when Telegram refuses it.

    Args:
        bot: The PTB bot.
        entry: A text chunk, or a file whose `file_path` is a private copy under `files_root`.
        files_root: Where the host keeps copies of files to send (`DataLayout.outbox_files`).
        remember: Called with the entry's new options before a fallback is sent.
        reply_to: Telegram's id of a message of the chat this one answers (sent even if that one was deleted).

    Returns:
        The confirmed send.

    Raises:
        Undeliverable: The entry can never be sent.
        telegram.error.TelegramError: Telegram (or the network) failed the send; see `failures.classify`.
    """
    try:
        chat_id = chat_id_of(entry.chat_jid)
    except ValueError as err:
        raise Undeliverable(str(err)) from None
    markup = _markup(entry, bot)
    reply = ReplyParameters(message_id=reply_to, allow_sending_without_reply=True) if reply_to is not None else None
    content = await _read_copy(entry, files_root) if entry.kind == "file" else None
    options = dict(entry.options)
    while True:
        form = _Form(entry, options, content)
        try:
            message = await form.send(bot, chat_id, markup, reply)
        except BadRequest as err:
            fallback = form.fallback(err)
            if fallback is None:
                raise
            options, how = fallback
            logger.warning(
                "Telegram refused outbox entry %d (%s); sending it again %s",
                entry.id,
                err.message,
                how,
                extra={"entryId": entry.id, "chat": entry.chat_jid},
            )
            remember(options)
            continue
        return Delivered(message=message, transcript_text=form.transcript_text())


def _markup(entry: OutboxEntry, bot: Bot) -> InlineKeyboardMarkup | None:
    data = entry.options.get("reply_markup")
    if data is None:
        return None
    try:
        if not isinstance(data, dict) or not isinstance(data.get("inline_keyboard"), list):
            raise TypeError("not an inline keyboard")
        return InlineKeyboardMarkup.de_json(data, bot)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise Undeliverable(f"reply_markup is not a valid inline keyboard: {err}") from None


async def _read_copy(entry: OutboxEntry, files_root: Path) -> bytes:
    root = files_root.resolve()
    path = Path(entry.file_path or "")
    if not entry.file_path or not path.is_absolute() or not path.resolve().is_relative_to(root):
        raise Undeliverable(f"file {entry.file_path!r} is not a copy under {root}")
    try:
        return await asyncio.to_thread(path.read_bytes)
    except OSError as err:
        raise Undeliverable(f"cannot read the file to send: {err.strerror or err} ({path.name})") from None


class _Form:
    """How one try sends an entry: text and parse mode, photo or document, and what to fall back to."""

    def __init__(self, entry: OutboxEntry, options: Mapping[str, Any], content: bytes | None) -> None:
        self.entry = entry
        self.options = options
        self.content = content
        limit = TELEGRAM_TEXT_LIMIT if content is None else TELEGRAM_CAPTION_LIMIT
        rendered = render(entry.body or "", plain=options.get("format") == "plain", limit=limit)
        self.text, self.parse_mode = rendered.text, rendered.parse_mode
        self.as_photo = (
            content is not None
            and options.get("send_as") != "document"
            and Path(entry.file_path or "").suffix.lower() in PHOTO_SUFFIXES
            and len(content) <= PHOTO_MAX_BYTES
        )
        name = options.get("file_name")
        self.file_name = name if isinstance(name, str) and name else Path(entry.file_path or "file").name

    async def send(
        self, bot: Bot, chat_id: int, markup: InlineKeyboardMarkup | None, reply: ReplyParameters | None
    ) -> Message:
        if self.content is None:
            return await bot.send_message(
                chat_id, self.text, parse_mode=self.parse_mode, reply_markup=markup, reply_parameters=reply
            )
        caption = self.text or None
        mode = self.parse_mode if caption else None
        if self.as_photo:
            return await bot.send_photo(
                chat_id, self.content, caption=caption, parse_mode=mode, reply_markup=markup, filename=self.file_name
            )
        return await bot.send_document(
            chat_id, self.content, caption=caption, parse_mode=mode, reply_markup=markup, filename=self.file_name
        )

    def fallback(self, err: BadRequest) -> tuple[dict[str, Any], str] | None:
        """The options of the next try after Telegram refused this one (and how it differs), or None."""
        if self.parse_mode is not None and self.text and _CHAT_NOT_FOUND not in err.message.lower():
            return {**self.options, "format": "plain"}, "as plain text"
        if self.as_photo and any(word in err.message.upper() for word in ("PHOTO", "IMAGE")):
            return {**self.options, "send_as": "document"}, "as a document"
        return None

    def transcript_text(self) -> str:
        body = self.entry.body or ""
        if self.content is None:
            return body
        return f"[{'photo' if self.as_photo else 'document'} {self.file_name}]" + (f" {body}" if body else "")
