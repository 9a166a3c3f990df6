"""Poller: the getUpdates loop, and everything about talking to Telegram that is not one update.

Connecting (getMe until it works, deleteWebhook, setMyCommands), the offset each poll starts from, backoff after
a failed poll, a refused token (fatal: `stopped_reason`), batches PTB cannot read, and updates whose handling
failed (recorded as errors so they never block the rest). What an update means is the handler's business; an
update that would hold the loop (a voice note to hear, and what its chat sends after it) goes to ChatQueues.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import warnings
from dataclasses import dataclass
from typing import Final

from telegram import Update
from telegram.error import Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.warnings import PTBUserWarning

from farmhost.outbox.text import describe_error, one_line
from farmhost.store import groups, telegram_state
from farmhost.telegram.delivery.failures import classify
from farmhost.telegram.inbound import commands
from farmhost.telegram.inbound.chat_queues import ChatQueues, UpdateHandler
from farmhost.telegram.inbound.media import MediaRetry
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts, retry_delay

logger = logging.getLogger(INBOUND_LOGGER)

ALLOWED_UPDATES: Final = ("message", "edited_message", "callback_query", "my_chat_member")
# Backoff of the polling loop after a failed getUpdates: 1 s, doubling, at most 30 s.
RETRY_DELAYS: Final = (1.0, 30.0)
# Short polling (FARMHOST_TELEGRAM_POLL_TIMEOUT=0) must not spin: at least this long between empty polls.
SHORT_POLL_PAUSE: Final = 1.0


@dataclass(frozen=True)
class _Unreadable:
    """An update python-telegram-bot could not parse: recorded as an error and confirmed, never retried."""

    update_id: int
    reason: str


class Poller:
    """Long-polls Telegram and hands every update to `handle`, one at a time, in order, or to its chat's queue."""

    def __init__(
        self,
        ports: InboundPorts,
        handle: UpdateHandler,
        queues: ChatQueues,
        *,
        retry_delays: tuple[float, float] = RETRY_DELAYS,
    ) -> None:
        self._ports = ports
        self._bot = ports.bot
        self._handle = handle
        self._queues = queues
        self._retry_delays = retry_delays
        self._failures = 0
        self.stopped_reason: str | None = None

    async def run(self) -> None:
        """Connect and poll until cancelled, a refused token or a bug (the last two set `stopped_reason`)."""
        try:
            if not await self._connect():
                return
            self._queues.resume()
            await self._poll()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not end Telegram silently
            logger.exception("telegram: the polling loop failed; incoming messages stop until farmhost restarts")
            self.stopped_reason = "the polling loop failed (see the log)"

    async def _connect(self) -> bool:
        """Call getMe (until it works), then deleteWebhook and setMyCommands once; False on a refused token."""
        while True:
            try:
                await self._bot.initialize()
                break
            except (InvalidToken, Forbidden) as err:
                self._fatal(err)
                return False
            except TelegramError as err:
                await self._backoff("connecting to Telegram", err)
        try:
            await self._bot.delete_webhook(drop_pending_updates=False)
        except TelegramError as err:
            logger.warning("telegram: deleteWebhook failed (%s); polling anyway", err)
        await self._set_commands()
        if self._failures:
            logger.info("telegram: connected again after %d failed attempt(s)", self._failures)
            self._failures = 0
        logger.info("telegram: polling as @%s", self._bot.username)
        return True

    async def _set_commands(self) -> None:
        failed = await commands.set_menus(self._bot, groups.main_group(self._ports.db.conn))
        if failed is not None:
            logger.warning("telegram: setMyCommands failed (%s); the command menu may be out of date", failed)

    async def _poll(self) -> None:
        while True:
            offset = telegram_state.get_offset(self._ports.db.conn)
            try:
                batch = await self._fetch(offset)
            except (InvalidToken, Forbidden) as err:
                self._fatal(err)
                return
            except RetryAfter as err:
                await self._backoff("getUpdates", err, wait=classify(err).retry_after)
                continue
            except Exception as err:  # noqa: BLE001 - network, 5xx, 409 conflict: retried with backoff
                await self._backoff("getUpdates", err)
                continue
            if self._failures:
                logger.info("telegram: polling works again after %d failed attempt(s)", self._failures)
                self._failures = 0
            if not batch and self._ports.settings.poll_timeout == 0:
                await asyncio.sleep(SHORT_POLL_PAUSE)
            for update in batch:
                if isinstance(update, _Unreadable):
                    logger.error("telegram: update %d is not readable and is skipped: %s", update.update_id,
                                 update.reason)  # fmt: skip
                    self._ports.finish(update.update_id, None, "error", update.reason)
                    continue
                try:
                    await self._hand_over(update)
                except MediaRetry as err:
                    await self._backoff(f"update {update.update_id}", err)
                    break  # the next poll starts again at this update
                except sqlite3.Error as err:
                    await self._backoff(f"storing update {update.update_id}", err)
                    break
                except Exception as err:  # noqa: BLE001 - logged with its traceback and recorded by _skip
                    if not await self._skip(update.update_id, err):
                        break

    async def _hand_over(self, update: Update) -> None:
        """Handle the update now, or leave it to its chat's queue (a voice note to hear, or one waiting for one)."""
        way = self._queues.offer(update)
        if way != "deferred":
            await self._handle(update, way == "busy")

    async def _fetch(self, offset: int | None) -> list[Update | _Unreadable]:
        """The next updates; a batch PTB cannot read is fetched again raw and read one update at a time."""
        try:
            updates = await self._bot.get_updates(
                offset=offset, timeout=self._ports.settings.poll_timeout, allowed_updates=list(ALLOWED_UPDATES)
            )
        except TelegramError:
            raise
        except Exception:
            logger.exception("telegram: an update from Telegram could not be read; reading the batch one by one")
            return await self._fetch_raw(offset)
        return list(updates)

    async def _fetch_raw(self, offset: int | None) -> list[Update | _Unreadable]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PTBUserWarning)  # "use Bot.get_updates": that is what just failed
            raw = await self._bot.do_api_request(
                "getUpdates", api_kwargs={"offset": offset, "timeout": 0, "allowed_updates": list(ALLOWED_UPDATES)}
            )
        batch: list[Update | _Unreadable] = []
        for item in raw if isinstance(raw, list) else []:
            update_id = item.get("update_id") if isinstance(item, dict) else None
            if not isinstance(update_id, int):
                raise TelegramError(f"Telegram sent an update without an update_id: {one_line(repr(item))}")
            try:
                batch.append(Update.de_json(item, self._bot))
            except Exception as err:  # noqa: BLE001 - whatever PTB raised, this one update is recorded and skipped
                batch.append(_Unreadable(update_id, f"unreadable update: {describe_error(err)}"))
        return batch

    async def _skip(self, update_id: int, err: Exception) -> bool:
        """Record an update that cannot be processed (a bug, hostile content) so that it never blocks the rest."""
        logger.error("telegram: update %d could not be processed and is skipped: %s", update_id, describe_error(err),
                     exc_info=err)  # fmt: skip
        try:
            self._ports.finish(update_id, None, "error", describe_error(err))
        except sqlite3.Error as db_err:
            await self._backoff(f"storing update {update_id}", db_err)
            return False
        return True

    async def _backoff(self, what: str, err: BaseException, *, wait: float | None = None) -> None:
        first, cap = self._retry_delays
        delay = wait if wait is not None else retry_delay(self._retry_delays, self._failures)
        self._failures += 1
        if self._failures == 1:
            logger.warning(
                "telegram: %s failed: %s; retrying (every %g-%g s) until it works",
                what,
                describe_error(err),
                first,
                cap,
            )
        else:
            logger.debug("telegram: %s failed again (%d): %s", what, self._failures, describe_error(err))
        await asyncio.sleep(delay)

    def _fatal(self, err: TelegramError) -> None:
        self.stopped_reason = f"Telegram refused the bot token (TELEGRAM_BOT_TOKEN): {err.message}"
        logger.error(
            "telegram: %s; incoming messages are off until the token is fixed and farmhost restarted "
            "(`farmhost doctor` checks it)",
            self.stopped_reason,
        )
