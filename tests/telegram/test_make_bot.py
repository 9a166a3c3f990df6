"""`make_bot` against the fake Bot API (URLs, a long poll beside a send) and the telegram:<id> jids."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from farmhost_testing import wait_for_async
from mosquitto import Certificates
from telegram.error import NetworkError
from telegram_stub import FakeTelegram

from farmhost.config import Settings, TelegramSettings, build_config
from farmhost.telegram.bot import chat_id_of, jid_of, make_bot, tls_context


def settings_for(tmp_path: Path, **values: object) -> TelegramSettings:
    return build_config(Settings(_env_file=None, data_dir=tmp_path, **values)).telegram  # type: ignore[call-arg]


async def test_a_long_poll_and_a_send_run_at_once_on_the_configured_server(
    tmp_path: Path, fake_telegram: FakeTelegram
) -> None:
    settings = settings_for(
        tmp_path,
        telegram_bot_token=fake_telegram.token,
        telegram_api_base_url=fake_telegram.api_root,
        telegram_poll_timeout=6,  # the send must be done while the poll waits, even on a loaded machine
    )
    bot = make_bot(settings)
    assert bot.base_url == f"{fake_telegram.api_root}/bot{fake_telegram.token}"
    assert bot.base_file_url == f"{fake_telegram.api_root}/file/bot{fake_telegram.token}"
    async with bot:
        assert bot.username == fake_telegram.username
        poll = asyncio.create_task(bot.get_updates(timeout=settings.poll_timeout))
        # recorded when the poll arrives (calls are recorded when answered)
        await wait_for_async(lambda: fake_telegram.offsets, what="the long poll to reach the fake Bot API")
        message = await bot.send_message(-100, "sent while the poll waits")
        assert not poll.done()  # the send did not wait for the poll's connection
        assert await poll == ()  # and the poll ended normally, not with a read timeout
    assert message.text == "sent while the poll waits"


async def test_a_bot_api_over_tls_is_verified_against_the_ca_setting_and_its_context_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared TLS context verifies as httpx's own would, and is built once per CA setting.

    certifi's CAs refuse a server they do not know; the CA named by SSL_CERT_FILE is trusted.
    """
    certs = Certificates(tmp_path / "certs", clients=())
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(*certs.server)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with FakeTelegram(tls=server_side) as fake:
        settings = settings_for(tmp_path, telegram_bot_token=fake.token, telegram_api_base_url=fake.api_root)
        assert settings.api_base_url is not None and settings.api_base_url.startswith("https://127.0.0.1:")
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with pytest.raises(NetworkError, match="CERTIFICATE_VERIFY_FAILED"):
            async with make_bot(settings):
                pass
        assert not fake.calls  # refused before any request reached the server
        monkeypatch.setenv("SSL_CERT_FILE", str(certs.ca))
        trusted = tls_context()
        assert tls_context() is trusted and trusted.verify_mode == ssl.CERT_REQUIRED and trusted.check_hostname
        bot = make_bot(settings)
        async with bot:
            assert bot.username == fake.username
            assert await bot.send_message(-100, "over TLS") is not None
    monkeypatch.delenv("SSL_CERT_FILE")
    assert tls_context() is not trusted  # certifi's again, a context of its own


def test_telegrams_own_server_is_the_default_and_a_token_is_required(tmp_path: Path) -> None:
    bot = make_bot(settings_for(tmp_path, telegram_bot_token="1:abc"))
    assert bot.base_url == "https://api.telegram.org/bot1:abc"
    assert bot.base_file_url == "https://api.telegram.org/file/bot1:abc"
    with pytest.raises(ValueError, match="TELEGRAM_BOT_TOKEN"):
        make_bot(settings_for(tmp_path))


@pytest.mark.parametrize(("jid", "chat_id"), [("telegram:42", 42), ("telegram:-1001234567890", -1001234567890)])
def test_telegram_jids_map_to_chat_ids_and_back(jid: str, chat_id: int) -> None:
    assert chat_id_of(jid) == chat_id and jid_of(chat_id) == jid


@pytest.mark.parametrize(
    "jid",
    [
        "whatsapp:42",
        "tg:42",
        "telegram",
        "telegram:",
        "telegram:abc",
        "telegram:1.5",
        "telegram:--1",
        "telegram:+1",
        "telegram: 1",
        "telegram:١٢",
        "TELEGRAM:1",
        "telegram:1" + "0" * 30,
    ],
)
def test_other_jids_are_refused_clearly(jid: str) -> None:
    with pytest.raises(ValueError, match="is not a Telegram chat"):
        chat_id_of(jid)
