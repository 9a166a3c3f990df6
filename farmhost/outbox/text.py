"""Names and other untrusted text from Telegram, flattened for one line of a transcript, prompt or log."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the safety messages' buttons import this without loading the Bot API client
    from telegram import Chat, Message, User


def one_line(text: str | None, limit: int = 200) -> str:
    """Control characters and line breaks become single spaces; at most `limit` characters (cut with `…`)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in (text or "")).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def user_name(user: User | None) -> str:
    """A user as the transcript names them: `@username`, else their full name."""
    if user is None:
        return "someone"
    if user.username:
        return f"@{user.username}"
    return one_line(user.full_name, 64) or f"user {user.id}"


def sender_name(message: Message) -> str:
    """Who wrote a message: the user, or the chat or channel it was sent as (anonymous admins, channels)."""
    if message.sender_chat is not None:
        return one_line(message.sender_chat.title or message.sender_chat.effective_name, 64) or "the chat"
    return user_name(message.from_user)


def chat_name(chat: Chat) -> str | None:
    """A chat's title (a private chat: the user's name)."""
    name = chat.title or chat.effective_name or (f"@{chat.username}" if chat.username else None)
    return one_line(name, 128) or None


def describe_error(err: BaseException) -> str:
    """`Type: message` on one line, for logs and the telegram_updates detail."""
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    return f"{type(err).__name__}: {one_line(message)}"
