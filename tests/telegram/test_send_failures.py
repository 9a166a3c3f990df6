"""How each Bot API failure is treated by the outbox: a table of exception -> kind and reason."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TimedOut,
)
from telegram.warnings import PTBDeprecationWarning

from farmhost.telegram.delivery.failures import FailureKind, classify


def caused(err: Exception, cause: Exception) -> Exception:
    err.__cause__ = cause  # what PTB's `raise ... from err` leaves behind
    return err


CASES: list[tuple[Callable[[], Exception], FailureKind, str]] = [
    (lambda: BadRequest("Bad Request: chat not found"), FailureKind.PERMANENT, "Bad Request: Chat not found"),
    (lambda: BadRequest("Bad Request: message is too long"), FailureKind.PERMANENT, "Bad Request: Message is too long"),
    (lambda: Forbidden("Forbidden: bot was blocked by the user"), FailureKind.PERMANENT, "bot was blocked by the user"),
    (lambda: ChatMigrated(-1009), FailureKind.MIGRATED, "register telegram:-1009 instead"),
    (lambda: NetworkError("Internal Server Error"), FailureKind.RETRY, "Internal Server Error"),
    (
        lambda: caused(NetworkError("httpx.RemoteProtocolError: gone"), httpx.RemoteProtocolError("gone")),
        FailureKind.RETRY,
        "RemoteProtocolError",
    ),
    (lambda: caused(TimedOut(), httpx.ReadTimeout("slow")), FailureKind.RETRY, "timed out waiting for Telegram"),
    (lambda: caused(TimedOut(), httpx.ConnectTimeout("no route")), FailureKind.UNREACHED, "Telegram unreachable"),
    (lambda: caused(TimedOut("Pool timeout"), httpx.PoolTimeout("busy")), FailureKind.UNREACHED, "unreachable"),
    (
        lambda: caused(NetworkError("httpx.ConnectError"), httpx.ConnectError("refused")),
        FailureKind.UNREACHED,
        "ConnectError('refused')",
    ),
    (lambda: InvalidToken("Unauthorized"), FailureKind.RETRY, "TELEGRAM_BOT_TOKEN"),
    (lambda: Conflict("Conflict: terminated"), FailureKind.RETRY, "Conflict"),
    (lambda: OSError("disk on fire"), FailureKind.RETRY, "unexpected error: OSError('disk on fire')"),
]


@pytest.mark.parametrize(("make", "kind", "reason"), CASES)
def test_failures_are_classified(make: Callable[[], Exception], kind: FailureKind, reason: str) -> None:
    failure = classify(make())
    assert failure.kind is kind and reason in failure.reason and failure.retry_after is None


@pytest.mark.parametrize("timedelta_mode", [False, True])
def test_retry_after_waits_what_telegram_says_either_way_ptb_reports_it(
    timedelta_mode: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if timedelta_mode:
        monkeypatch.setenv("PTB_TIMEDELTA", "true")
        err = RetryAfter(7)
    else:
        monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
        with pytest.warns(PTBDeprecationWarning):
            err = RetryAfter(7)
    failure = classify(err)
    assert (failure.kind, failure.retry_after, failure.reason) == (
        FailureKind.FLOOD,
        7.0,
        "flood control: retry after 7 s",
    )
