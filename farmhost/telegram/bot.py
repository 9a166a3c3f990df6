"""The python-telegram-bot `Bot` farmhost talks through, and the mapping between chat ids and jids."""

from __future__ import annotations

import functools
import os
import ssl
from typing import TYPE_CHECKING, Final

import httpx
from telegram import Bot
from telegram.request import HTTPXRequest

if TYPE_CHECKING:
    from farmhost.config import TelegramSettings

DEFAULT_API_ROOT: Final = "https://api.telegram.org"
JID_PREFIX: Final = "telegram:"

# Telegram answers a send in well under a second; 10 s to connect or push a request is a dead network, not a slow one.
CONNECT_TIMEOUT: Final = 10.0
WRITE_TIMEOUT: Final = 10.0
# A send can wait on Telegram's own flood queue; 15 s before calling it a timeout (and retrying with backoff).
READ_TIMEOUT: Final = 15.0
# Per socket write, not for the whole upload: a 50 MB document on a slow farm uplink stalls briefly, not for 60 s.
MEDIA_WRITE_TIMEOUT: Final = 60.0
# A send waiting for a free connection is queued, not failed: many chats may deliver at once.
POOL_TIMEOUT: Final = 10.0
# Outbox workers (one per chat with due entries) plus the inbound side's getFile, chat actions and callback answers.
SEND_POOL_SIZE: Final = 16
# PTB adds the long-poll `timeout` to this read timeout for getUpdates, so a poll may take poll_timeout + 15 s
# before it counts as hung; 15 s covers Telegram's own delay in answering an expired long poll.
GET_UPDATES_READ_MARGIN: Final = 15.0
# One poll at a time, plus one in case a stale one is still being torn down.
GET_UPDATES_POOL_SIZE: Final = 2


def api_root(settings: TelegramSettings) -> str:
    """The Bot API server root: TELEGRAM_API_BASE_URL, else Telegram's."""
    return settings.api_base_url or DEFAULT_API_ROOT


def tls_context() -> ssl.SSLContext:
    """The TLS context of every connection to the Bot API: httpx's default, built once per CA setting.

    httpx builds one per client (and PTB builds a client per pool, and again after each `shutdown()`), each reading
    the whole CA bundle: ~22 ms of CPU here, a daemon's biggest single cost at start with Telegram on. The same
    context verifies the same way (certificates and host names, with the CA bundle httpx would take: SSL_CERT_FILE
    or SSL_CERT_DIR when set, else certifi's); a changed CA setting gets a context of its own. Sharing it is safe
    because nothing changes it but httpcore, which sets its ALPN protocols at each connection, to HTTP/1.1 for both
    of make_bot's pools (PTB's default `http_version`): a caller asking for HTTP/2 must not take this context.
    """
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    # The arguments are the cache's key: httpx reads the same two variables itself.
    return httpx.create_ssl_context(verify=True, trust_env=True)


def make_bot(settings: TelegramSettings) -> Bot:
    """Build the Bot used for every call to Telegram; its owner calls `initialize()` and `shutdown()`.

    Sends and the long poll use separate connection pools (PTB's `get_updates_request`), so a hung
    getUpdates never delays a send.

    Args:
        settings: Needs `bot_token`; `api_base_url` (a self-hosted Bot API server or a test
            server) replaces Telegram's root: methods at `<root>/bot<token>/<method>`, files at
            `<root>/file/bot<token>/<path>`.

    Returns:
        An uninitialised `telegram.Bot`.

    Raises:
        ValueError: Telegram is not configured (no token).
    """
    if not settings.bot_token:
        raise ValueError("TELEGRAM_BOT_TOKEN is not set; Telegram is off")
    # PTB 22 warns on every RetryAfter unless it may already give durations as timedelta (its next major
    # version's behaviour); failures.classify reads both forms.
    os.environ.setdefault("PTB_TIMEDELTA", "true")
    root = api_root(settings)
    verify = {"verify": tls_context()}
    request = HTTPXRequest(
        connection_pool_size=SEND_POOL_SIZE,
        connect_timeout=CONNECT_TIMEOUT,
        write_timeout=WRITE_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        pool_timeout=POOL_TIMEOUT,
        media_write_timeout=MEDIA_WRITE_TIMEOUT,
        httpx_kwargs=verify,
    )
    get_updates_request = HTTPXRequest(
        connection_pool_size=GET_UPDATES_POOL_SIZE,
        connect_timeout=CONNECT_TIMEOUT,
        write_timeout=WRITE_TIMEOUT,
        read_timeout=GET_UPDATES_READ_MARGIN,
        pool_timeout=POOL_TIMEOUT,
        httpx_kwargs=verify,
    )
    return Bot(
        settings.bot_token,
        base_url=f"{root}/bot",
        base_file_url=f"{root}/file/bot",
        request=request,
        get_updates_request=get_updates_request,
    )


def chat_id_of(jid: str) -> int:
    """The Telegram chat id of a `telegram:<chat id>` jid.

    Raises:
        ValueError: The jid is not a Telegram chat (another channel, or not a number after the prefix).
    """
    channel, sep, rest = jid.partition(":")
    if not sep or f"{channel}:" != JID_PREFIX:
        raise ValueError(f"{jid!r} is not a Telegram chat (expected telegram:<chat id>)")
    body = rest.removeprefix("-")
    if not body.isascii() or not body.isdigit() or len(body) > 20:
        raise ValueError(f"{jid!r} is not a Telegram chat (the chat id must be an integer)")
    return int(rest)


def jid_of(chat_id: int) -> str:
    """The jid of a Telegram chat id."""
    return f"{JID_PREFIX}{chat_id}"
