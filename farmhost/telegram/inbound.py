"""TelegramInbound: everything that comes in from Telegram, by long polling.

One update at a time: it is routed (routing.py), its media fetched into the group's inbox (media.py), and then
everything it produced (the telegram_updates row, the transcript row, the chats row, a pending chat, outbox
entries, a queued run) is committed in ONE transaction together with the new offset (update_id + 1). Only then is
the next getUpdates sent with that offset, which is what confirms the update to Telegram. A crash before the
commit gets the update again; an update id already in telegram_updates is dropped. At least once, never twice.

Triggered messages are stored `queued` and handed to ChatRuns (chat_runs.py), which runs them in the background
and queues the replies. All replies and notices go through the outbox; only chat actions (typing), callback
answers and the edit of an approval message are sent directly. docs/telegram.md has the whole story.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from telegram import Bot, BotCommand, BotCommandScopeChat, CallbackQuery, Chat, ChatMemberUpdated, Message, Update, User
from telegram.error import Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.warnings import PTBUserWarning

from farmhost.agents import AgentRuntime
from farmhost.config import Settings
from farmhost.errors import ConfigError, FarmhostError
from farmhost.layout import DataLayout
from farmhost.store import chats, groups, tasks, telegram_state, transcripts
from farmhost.store.db import Database, now_utc
from farmhost.store.groups import Group
from farmhost.store.task_runs import last_statuses
from farmhost.store.telegram_state import QueuedRun, UpdateStatus
from farmhost.telegram import approvals, commands
from farmhost.telegram.bot import chat_id_of, jid_of
from farmhost.telegram.chat_runs import TYPING_INTERVAL, ChatRuns
from farmhost.telegram.failures import classify
from farmhost.telegram.media import MediaRef, MediaRetry, media_of, placeholder, save_media
from farmhost.telegram.notices import enqueue_notice
from farmhost.telegram.routing import Incoming, Route, parse_senders, route
from farmhost.telegram.text import chat_name, describe_error, one_line, sender_name, user_name

logger = logging.getLogger(__name__)

ALLOWED_UPDATES: Final = ("message", "edited_message", "callback_query", "my_chat_member")
# Backoff of the polling loop after a failed getUpdates: 1 s, doubling, at most 30 s.
RETRY_DELAYS: Final = (1.0, 30.0)
# A media download failing on the network is retried with its update this many times, then saved as a note only.
MEDIA_TRIES: Final = 3
# Processed updates are kept this long (Telegram never redelivers a confirmed one; the rows only serve diagnosis).
UPDATE_RETENTION: Final = timedelta(days=30)
# Short polling (FARMHOST_TELEGRAM_POLL_TIMEOUT=0) must not spin: at least this long between empty polls.
SHORT_POLL_PAUSE: Final = 1.0

StatusSource = Callable[[], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class _Unreadable:
    """An update python-telegram-bot could not parse: recorded as an error and confirmed, never retried."""

    update_id: int
    reason: str


class TelegramInbound:
    """Long-polls Telegram and turns every update into stored messages, agent runs, commands and approvals."""

    def __init__(
        self,
        *,
        db: Database,
        settings: Settings,
        layout: DataLayout,
        bot: Bot,
        runtime: AgentRuntime,
        wake_outbox: Callable[[], None],
        status: StatusSource | None,
        on_groups_changed: Callable[[], None] | None = None,
        clock: Callable[[], datetime] = now_utc,
        typing_interval: float = TYPING_INTERVAL,
        retry_delays: tuple[float, float] = RETRY_DELAYS,
    ) -> None:
        """Prepare the service; nothing runs before `start()`.

        Args:
            db: The daemon's database (used from the event loop's thread).
            settings: Poll timeout, main-chat senders, media cap, time zone.
            layout: The data directory (group workspaces, for the inbox and new groups).
            bot: The PTB bot from `make_bot`; its owner shuts it down (it is initialised here if it is not yet).
            runtime: Where triggered messages become agent runs.
            wake_outbox: Called after anything was queued in the outbox (OutboxDelivery.wake).
            status: The app's part of `/status` (Home Assistant, version...); None shows the store's counts only.
            on_groups_changed: Called after an approval registered a group (IpcService.reload_groups: the IPC
                service does not see commits made on its own connection).
            clock: The current time (aware).
            typing_interval: Seconds between two typing indicators while a run goes on.
            retry_delays: The first and the longest wait after a failed poll.

        Raises:
            ConfigError: FARMHOST_TELEGRAM_MAIN_SENDERS is not a list of user ids.
        """
        try:
            self._main_senders = parse_senders(settings.telegram_main_senders)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self._db = db
        self._settings = settings
        self._layout = layout
        self._bot = bot
        self._runtime = runtime
        self._runs = ChatRuns(
            db=db,
            settings=settings,
            bot=bot,
            runtime=runtime,
            wake_outbox=wake_outbox,
            clock=clock,
            typing_interval=typing_interval,
        )
        self._wake_outbox = wake_outbox
        self._status = status
        self._on_groups_changed = on_groups_changed
        self._clock = clock
        self._retry_delays = retry_delays
        self._poller: asyncio.Task[None] | None = None
        self._media_failures: dict[int, int] = {}
        self._failures = 0
        self.stopped_reason: str | None = None

    # lifecycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume the runs a restart interrupted and start polling (in the background; never waits for Telegram)."""
        if self._poller is not None:
            return
        self.stopped_reason = None
        with self._db.tx() as conn:
            telegram_state.prune_updates(conn, older_than=self._clock() - UPDATE_RETENTION)
        self._runs.resume()
        self._poller = asyncio.create_task(self._poll_forever(), name="telegram:poll")

    async def stop(self) -> None:
        """Stop polling at once (a waiting long poll is cancelled) and stop following runs.

        Runs already submitted go on in the runtime until it stops; their rows stay `queued`, so an outcome that
        arrives after this is not recorded and the next start submits the message again.
        """
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        await self._runs.stop()

    @property
    def polling(self) -> bool:
        """Whether the polling loop is running (False after `stop()` or a fatal error, see `stopped_reason`)."""
        return self._poller is not None and not self._poller.done()

    # polling --------------------------------------------------------------------------------------------

    async def _poll_forever(self) -> None:
        try:
            if not await self._connect():
                return
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
        main = groups.main_group(self._db.conn)
        try:
            await self._bot.set_my_commands([BotCommand(name, text) for name, text in commands.MENU.items()])
            if main is not None:
                await self._bot.set_my_commands(
                    [BotCommand(name, text) for name, text in commands.MAIN_MENU.items()],
                    scope=BotCommandScopeChat(chat_id_of(main.jid)),
                )
        except (TelegramError, ValueError) as err:
            logger.warning("telegram: setMyCommands failed (%s); the command menu may be out of date", err)

    async def _poll(self) -> None:
        while True:
            offset = telegram_state.get_offset(self._db.conn)
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
            if not batch and self._settings.telegram_poll_timeout == 0:
                await asyncio.sleep(SHORT_POLL_PAUSE)
            for update in batch:
                if isinstance(update, _Unreadable):
                    logger.error("telegram: update %d is not readable and is skipped: %s", update.update_id,
                                 update.reason)  # fmt: skip
                    self._finish(update.update_id, None, "error", update.reason)
                    continue
                try:
                    await self._handle(update)
                except MediaRetry as err:
                    await self._backoff(f"update {update.update_id}", err)
                    break  # the next poll starts again at this update
                except sqlite3.Error as err:
                    await self._backoff(f"storing update {update.update_id}", err)
                    break
                except Exception as err:  # noqa: BLE001 - logged with its traceback and recorded by _skip
                    if not await self._skip(update.update_id, err):
                        break

    async def _fetch(self, offset: int | None) -> list[Update | _Unreadable]:
        """The next updates; a batch PTB cannot read is fetched again raw and read one update at a time."""
        try:
            updates = await self._bot.get_updates(
                offset=offset, timeout=self._settings.telegram_poll_timeout, allowed_updates=list(ALLOWED_UPDATES)
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
            self._finish(update_id, None, "error", describe_error(err))
        except sqlite3.Error as db_err:
            await self._backoff(f"storing update {update_id}", db_err)
            return False
        return True

    async def _backoff(self, what: str, err: BaseException, *, wait: float | None = None) -> None:
        first, cap = self._retry_delays
        delay = wait if wait is not None else min(cap, first * 2 ** min(self._failures, 16))
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

    # one update ---------------------------------------------------------------------------------------------

    async def _handle(self, update: Update) -> None:
        if telegram_state.seen(self._db.conn, update.update_id):
            logger.info("telegram: update %d was delivered again; dropped", update.update_id)
            with self._db.tx() as conn:
                telegram_state.advance_offset(conn, update.update_id)
            return
        if update.callback_query is not None:
            await self._on_callback(update.update_id, update.callback_query)
        elif update.message is not None:
            await self._on_message(update.update_id, update.message, edited=False)
        elif update.edited_message is not None:
            await self._on_message(update.update_id, update.edited_message, edited=True)
        elif update.my_chat_member is not None:
            self._on_membership(update.update_id, update.my_chat_member)
        else:
            self._finish(update.update_id, None, "ignored", "an update type farmhost does not handle")

    def _finish(
        self,
        update_id: int,
        jid: str | None,
        status: UpdateStatus,
        detail: str | None,
        work: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Record the update, do `work`, and move the offset past it: one transaction."""
        with self._db.tx() as conn:
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=jid, status=status, detail=detail, at=self._clock()
            )
            if work is not None:
                work(conn)
            telegram_state.advance_offset(conn, update_id)

    async def _on_message(self, update_id: int, message: Message, *, edited: bool) -> None:
        chat = message.chat
        jid = jid_of(chat.id)
        group = groups.find_by_jid(self._db.conn, jid)
        text = message.text or message.caption or ""
        ref = media_of(message, max_bytes=self._settings.telegram_media_max_bytes)
        sender = message.from_user
        if group is not None and message.migrate_to_chat_id is not None:
            logger.warning(
                "telegram: chat %s (folder %s) became a supergroup with id %d; register telegram:%d for it "
                "(farmhost group add) and remove the old registration",
                jid,
                group.folder,
                message.migrate_to_chat_id,
                message.migrate_to_chat_id,
            )
        if not text and ref is None:
            self._finish(update_id, jid, "ignored", "no text or media (a service message)", self._seen_chat(chat))
            return
        incoming = Incoming(
            text=text,
            chat_type=chat.type,
            sender_id=sender.id if sender else None,
            sender_is_bot=bool(sender and sender.is_bot and message.sender_chat is None),
            reply_to_bot=self._replies_to_bot(message),
        )
        decision = route(
            group, incoming, bot_username=self._bot.username, bot_id=self._bot.id, main_senders=self._main_senders
        )
        if edited and decision.action in ("run", "command"):
            decision = Route("store", "an edited message: context only")
        if decision.action == "ignore" or (edited and decision.action == "offer"):
            level = logging.INFO if group is not None else logging.DEBUG
            logger.log(level, "telegram: message %d in %s ignored: %s", message.message_id, jid, decision.reason)
            self._finish(update_id, jid, "ignored", decision.reason, self._seen_chat(chat))
        elif decision.action == "offer":
            self._offer(update_id, chat, sender)
        else:
            assert group is not None
            await self._store_message(update_id, message, group, decision, text, ref, edited=edited)

    async def _store_message(
        self,
        update_id: int,
        message: Message,
        group: Group,
        decision: Route,
        text: str,
        ref: MediaRef | None,
        *,
        edited: bool,
    ) -> None:
        jid = group.jid
        body = text
        if ref is not None:
            note = f"[{ref.kind}]" if edited else await self._save_media(update_id, group, ref, message)
            body = f"{note} {text}".strip()
        at = (message.edit_date if edited else None) or message.date
        key = f"tg:{message.chat.id}:{message.message_id}"
        if edited:
            body = f"(edited) {body}"
            key += f":edit:{int(at.timestamp())}"
        reply = await self._command_reply(decision, group) if decision.action == "command" else None
        sender = sender_name(message)
        queued: list[QueuedRun] = []

        def store(conn: sqlite3.Connection) -> None:
            chats.upsert_chat(conn, jid=jid, name=chat_name(message.chat), channel="telegram", seen_at=self._clock())
            tid = transcripts.append(
                conn, chat_jid=jid, direction="in", sender=sender, text=body, at=at, message_key=key
            )
            status: UpdateStatus = "stored"
            if decision.action == "run" and tid is not None:
                after = telegram_state.consumed_through(conn, jid)
                telegram_state.queue_run(
                    conn, update_id=update_id, chat_jid=jid, transcript_id=tid, context_after=after, at=self._clock()
                )
                telegram_state.consume_through(conn, jid, tid)
                queued.extend(telegram_state.queued_runs(conn, update_id))
                return
            if reply is not None:
                status = "command"
                enqueue_notice(conn, key=f"command:{update_id}", jid=jid, text=reply, at=self._clock())
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=jid, status=status, detail=decision.reason, at=self._clock()
            )

        with self._db.tx() as conn:
            store(conn)
            telegram_state.advance_offset(conn, update_id)
        self._media_failures.pop(update_id, None)
        if queued:
            logger.info("telegram: message %d in %s (%s) starts a run: %s", message.message_id, jid, group.folder,
                        decision.reason)  # fmt: skip
            self._runs.spawn(queued[0])
        if reply is not None:
            self._wake_outbox()

    async def _save_media(self, update_id: int, group: Group, ref: MediaRef, message: Message) -> str:
        try:
            return await save_media(
                self._bot,
                ref,
                self._layout.workspace(group.folder),
                message_id=message.message_id,
                local_time=message.date.astimezone(self._settings.zone),
                max_bytes=self._settings.telegram_media_max_bytes,
            )
        except MediaRetry as err:
            tries = self._media_failures.get(update_id, 0) + 1
            if tries < MEDIA_TRIES:
                self._media_failures[update_id] = tries
                raise
            self._media_failures.pop(update_id, None)
            logger.warning("telegram: giving up on the %s of message %d: %s", ref.kind, message.message_id, err)
            return placeholder(ref, f"(not saved: {one_line(str(err))})")

    async def _command_reply(self, decision: Route, group: Group) -> str:
        command = decision.command
        if command in ("help", "start"):
            return commands.help_text(group, self._bot.username)
        assert command is not None
        if not group.is_main:
            return commands.refusal(command)
        if command == "status":
            return commands.status_text(await self._status_document(), now=self._clock(), zone=self._settings.zone)
        rows = tasks.list_tasks(self._db.conn)
        return commands.tasks_text(rows, last_statuses(self._db.conn), zone=self._settings.zone)

    async def _status_document(self) -> dict[str, Any]:
        extra: dict[str, Any] | None = None
        if self._status is not None:
            try:
                extra = await self._status()
            except Exception as err:
                logger.exception("telegram: the status source failed")
                extra = {"note": f"part of the status is unavailable ({type(err).__name__})"}
        conn = self._db.conn
        queued = sum(self._runtime.queued(group.folder) for group in groups.list_groups(conn))
        return commands.collect_status(conn, running=len(self._runtime.running), queued=queued, extra=extra)

    def _replies_to_bot(self, message: Message) -> bool:
        replied = message.reply_to_message
        return bool(replied and replied.from_user and replied.from_user.id == self._bot.id)

    def _seen_chat(self, chat: Chat) -> Callable[[sqlite3.Connection], None]:
        def work(conn: sqlite3.Connection) -> None:
            chats.upsert_chat(
                conn, jid=jid_of(chat.id), name=chat_name(chat), channel="telegram", seen_at=self._clock()
            )

        return work

    # approvals -------------------------------------------------------------------------------------------------

    def _offer(self, update_id: int, chat: Chat, requester: User | None) -> None:
        jid = jid_of(chat.id)
        outcome: list[str] = []

        def work(conn: sqlite3.Connection) -> None:
            self._seen_chat(chat)(conn)
            outcome.append(
                approvals.offer(
                    conn,
                    jid=jid,
                    title=chat_name(chat) or jid,
                    requested_by=user_name(requester),
                    key=str(update_id),
                    at=self._clock(),
                )
            )

        with self._db.tx() as conn:
            work(conn)
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=jid, status="offered", detail=outcome[0], at=self._clock()
            )
            telegram_state.advance_offset(conn, update_id)
        logger.info("telegram: unregistered chat %s (%s) asked for the bot: %s", jid, chat_name(chat), outcome[0])
        self._wake_outbox()

    def _on_membership(self, update_id: int, change: ChatMemberUpdated) -> None:
        chat = change.chat
        jid = jid_of(chat.id)
        old, new = change.old_chat_member.status, change.new_chat_member.status
        joined = new in ("member", "administrator") and old in ("left", "kicked")
        group = groups.find_by_jid(self._db.conn, jid)
        if joined and group is None and chat.type in ("group", "supergroup"):
            self._offer(update_id, chat, change.from_user)
            return
        if new in ("left", "kicked") and group is not None:
            logger.warning(
                "telegram: the bot was removed from %s (folder %s); the group stays registered "
                "(`farmhost group remove %s` unregisters it)",
                jid,
                group.folder,
                group.folder,
            )
        self._finish(update_id, jid, "ignored", f"the bot's membership changed: {old} -> {new}", self._seen_chat(chat))

    async def _on_callback(self, update_id: int, query: CallbackQuery) -> None:
        parsed = approvals.parse_callback(query.data)
        message = query.message
        chat_jid = jid_of(message.chat.id) if message is not None else None
        conn = self._db.conn
        main = groups.main_group(conn)
        who = user_name(query.from_user)
        if parsed is None:
            self._finish(update_id, chat_jid, "ignored", f"unknown button data {one_line(query.data, 80)!r}")
            await self._answer(query, "This button is not used any more.")
            return
        choice, jid = parsed
        if main is None or chat_jid != main.jid:
            self._finish(update_id, chat_jid, "refused", f"{choice} {jid} pressed outside the main chat by {who}")
            await self._answer(query, "Only the farm's main chat can approve chats.")
            return
        if self._main_senders and query.from_user.id not in self._main_senders:
            self._finish(update_id, chat_jid, "refused", f"{choice} {jid} by {who}: not in the main senders")
            await self._answer(query, "You are not allowed to approve chats.")
            return
        try:
            with self._db.tx() as conn:
                decision = approvals.decide(
                    conn,
                    self._layout,
                    choice=choice,
                    jid=jid,
                    decided_by=who,
                    bot_username=self._bot.username,
                    key=str(update_id),
                    at=self._clock(),
                )
                telegram_state.record_update(
                    conn, update_id=update_id, chat_jid=chat_jid, status="callback", detail=decision.answer,
                    at=self._clock(),
                )  # fmt: skip
                telegram_state.advance_offset(conn, update_id)
        except (FarmhostError, OSError) as err:
            reason = err.message if isinstance(err, FarmhostError) else f"cannot create its folders: {err}"
            logger.error("telegram: approving %s failed: %s", jid, reason)
            self._finish(update_id, chat_jid, "error", reason)
            await self._answer(query, f"Could not connect {jid}: {reason}")
            return
        logger.info("telegram: %s pressed %s for %s: %s", who, choice, jid, decision.answer)
        if decision.group is not None:
            if self._on_groups_changed is not None:
                self._on_groups_changed()
            self._wake_outbox()
        await self._answer(query, decision.answer)
        if decision.note and isinstance(message, Message) and message.text:
            try:
                await self._bot.edit_message_text(
                    f"{message.text}\n\n{decision.note}", chat_id=message.chat.id, message_id=message.message_id
                )
            except TelegramError as err:
                logger.warning("telegram: cannot update the approval message: %s", err)

    async def _answer(self, query: CallbackQuery, text: str) -> None:
        try:
            await self._bot.answer_callback_query(query.id, text=text[:200])
        except TelegramError as err:
            logger.warning("telegram: cannot answer a button press: %s", err)
