"""What a failed Bot API call means for an outbox entry: wait, retry, or give up (pure; one table)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

import httpx
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.warnings import PTBDeprecationWarning


class FailureKind(StrEnum):
    """How the outbox treats a failed send."""

    FLOOD = "flood"  # Telegram said when to come back (429): wait exactly that, not counted as an attempt
    UNREACHED = "unreached"  # the request never left the host (no connection): back off, not counted
    RETRY = "retry"  # may be transient (5xx, timeout, dropped connection): back off, counted
    PERMANENT = "permanent"  # Telegram refused this message for good (400, 403): failed at once
    MIGRATED = "migrated"  # the group became a supergroup (`new_chat_id`): the chat follows it, the entry goes there


@dataclass(frozen=True, kw_only=True)
class Failure:
    """A classified failure: its kind, a one-line reason for the log and `outbox list`, and the wait for FLOOD."""

    kind: FailureKind
    reason: str
    retry_after: float | None = None
    new_chat_id: int | None = None


# Transport errors raised before a single byte of the request reached Telegram: retrying them cannot duplicate a
# message, and a dead uplink is no fault of the message, so they never use up its attempts.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def classify(err: Exception) -> Failure:
    """Classify an exception raised by a PTB send.

    Args:
        err: A `TelegramError` (or anything else a send raised: an unexpected error is retried, counted).

    Returns:
        The failure's kind and reason.
    """
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    if isinstance(err, RetryAfter):
        seconds = _retry_after_seconds(err)
        return Failure(kind=FailureKind.FLOOD, reason=f"flood control: retry after {seconds:g} s", retry_after=seconds)
    if isinstance(err, ChatMigrated):
        return Failure(
            kind=FailureKind.MIGRATED,
            reason=f"the group became a supergroup with chat id {err.new_chat_id}; register telegram:"
            f"{err.new_chat_id} instead",
            new_chat_id=err.new_chat_id,
        )
    if isinstance(err, BadRequest):  # PTB drops Telegram's "Bad Request: " prefix; it says who refused
        return Failure(kind=FailureKind.PERMANENT, reason=f"Bad Request: {message}")
    if isinstance(err, Forbidden):
        return Failure(kind=FailureKind.PERMANENT, reason=message)
    if isinstance(err, InvalidToken):
        return Failure(kind=FailureKind.RETRY, reason=f"Telegram refused the bot token (TELEGRAM_BOT_TOKEN): {message}")
    if isinstance(err, NetworkError) and isinstance(err.__cause__, _NOT_SENT):
        return Failure(kind=FailureKind.UNREACHED, reason=f"Telegram unreachable: {err.__cause__!r}")
    if isinstance(err, TimedOut):
        return Failure(kind=FailureKind.RETRY, reason="timed out waiting for Telegram")
    if isinstance(err, TelegramError):
        return Failure(kind=FailureKind.RETRY, reason=message)
    return Failure(kind=FailureKind.RETRY, reason=f"unexpected error: {err!r}")


def _retry_after_seconds(err: RetryAfter) -> float:
    # PTB 22 warns on reading `retry_after` unless PTB_TIMEDELTA is set (then it is a timedelta); accept both.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = err.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
