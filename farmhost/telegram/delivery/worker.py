"""OutboxDelivery: the one outbound path, from the durable outbox to Telegram.

Every message the host sends (agent replies, IPC `messages/`, task alerts, approvals) is an outbox entry first;
this service sends the due ones, oldest first per chat, one chat never waiting on another.

Guarantees and decisions:
- Per-chat order: only the head of a chat may go, its oldest pending entry except that the host's own messages
  go ahead of agents' messages not begun yet (store/outbox.py `chat_head`); while it waits for a retry the
  chat's later entries wait too. Chats are delivered concurrently, one worker per chat.
- A confirmed send is marked `sent` (with Telegram's message id) and appended to the chat's transcript in one
  transaction; only `pending` entries are ever sent, so a confirmed chunk is never sent again, restarts included.
  Honest limit: a crash (or a timeout) between Telegram accepting a chunk and that commit sends it again.
- Text goes as HTML (formatting.py); if Telegram refuses it (any 400 except "chat not found") the same chunk is
  sent again at once as plain text, and `options.format = "plain"` is stored first, so a retry never flips back;
  a photo Telegram cannot process goes again as a document (sending.py).
- 429 (RetryAfter): the chat waits exactly `retry_after`; not counted as an attempt (Telegram told us when).
- 5xx, timeouts, dropped connections, an invalid token: retried with exponential backoff (base * 2**n, capped),
  each counted; after `outbox_max_attempts` the entry is `failed` with the last error.
- No connection at all (the request never left the host): backoff, not counted, so a long uplink outage loses
  nothing; `farmhost doctor` reports entries pending for more than 10 minutes.
- Other 400s and 403 (chat not found, bot blocked or removed), a missing file: `failed` at once with the reason,
  together with the later chunks of the same message.
- A group that became a supergroup (400 with `migrate_to_chat_id`): its registration and its undelivered entries
  follow it to the new id (store/chat_moves.py, as the inbound side does on Telegram's notice) and go there; only a
  chat that is not registered (or whose new id is registered already) has its entry failed.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from farmhost.store import chat_moves, outbox, transcripts
from farmhost.store.db import now_utc
from farmhost.telegram.bot import jid_of
from farmhost.telegram.delivery.failures import Failure, FailureKind, classify
from farmhost.telegram.delivery.sending import Delivered, Undeliverable, send_entry

if TYPE_CHECKING:
    from telegram import Bot

    from farmhost.config import TelegramSettings
    from farmhost.layout import DataLayout
    from farmhost.store.db import Database
    from farmhost.store.outbox import OutboxEntry

logger = logging.getLogger(__name__)

# The first retry after FARMHOST_OUTBOX_RETRY_SECONDS (2 s), doubling: a 5xx blip is over by the second try, and
# 5 minutes between tries keeps a long outage cheap while still delivering within minutes of recovery.
BACKOFF_CAP: Final = 300.0
# Anything queued without a wake() (another service forgot, a crash) still goes out within this long.
RESCAN_INTERVAL: Final = 10.0
# On stop, a send already on the wire gets this long to be confirmed and recorded before it is cancelled
# (a cancelled send may have reached Telegram and would go again after the restart).
STOP_GRACE: Final = 3.0
DEFAULT_SENDER: Final = "farmhost"


class OutboxDelivery:
    """Sends due outbox entries to Telegram; `wake()` when something was queued."""

    def __init__(
        self,
        *,
        db: Database,
        settings: TelegramSettings,
        layout: DataLayout,
        bot: Bot,
        clock: Callable[[], datetime] = now_utc,
        backoff_cap: float = BACKOFF_CAP,
        rescan_interval: float = RESCAN_INTERVAL,
        stop_grace: float = STOP_GRACE,
        on_groups_changed: Callable[[], None] | None = None,
    ) -> None:
        """Prepare the service (nothing runs before `start()`).

        Args:
            db: The daemon's database (used from the event loop's thread).
            settings: Telegram's section; `outbox_max_attempts` and `outbox_retry_seconds` (the first retry's wait,
                doubling per failure) are read from it.
            layout: Where the private copies of files to send live (`outbox_files`).
            bot: The PTB bot from `make_bot`; its owner initialises and shuts it down.
            clock: The current time (aware); due times are compared against it.
            backoff_cap: The longest wait between retries.
            rescan_interval: Seconds between scans of the outbox when nobody calls `wake()`.
            stop_grace: Seconds `stop()` waits for sends in flight.
            on_groups_changed: Called after a group was moved to its supergroup's id (GroupRegistry.reload).
        """
        self._db = db
        self._settings = settings
        self._layout = layout
        self._bot = bot
        self._clock = clock
        self._backoff_cap = backoff_cap
        self._rescan_interval = rescan_interval
        self._stop_grace = stop_grace
        self._on_groups_changed = on_groups_changed
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._streaks: dict[int, int] = {}  # entry id -> consecutive backoff failures (for the delay only)

    async def start(self) -> None:
        """Start delivering (pending entries left from before a restart go first)."""
        if self._task is not None:
            return
        self._stopping = False
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._dispatch_loop(), name="outbox-delivery")

    def wake(self) -> None:
        """Look at the outbox now (something was queued); never blocks."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop: sends in flight get `stop_grace` seconds to be confirmed, then are cancelled (they stay pending)."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        workers = list(self._workers.values())
        if workers:
            _, late = await asyncio.wait(workers, timeout=self._stop_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        self._workers.clear()

    async def _dispatch_loop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                delay = self._start_due_workers()
            except sqlite3.Error as err:  # e.g. the database locked by a stuck writer: look again later
                logger.warning("cannot read the outbox: %s; trying again in %g s", err, self._rescan_interval)
                delay = self._rescan_interval
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _start_due_workers(self) -> float:
        """Start a worker for each chat whose head is due; returns the seconds until the next head is due."""
        now = self._clock()
        delay = self._rescan_interval
        for head in outbox.chat_heads(self._db.conn):
            if head.chat_jid in self._workers:
                continue
            wait = (_due(head) - now).total_seconds()
            if wait <= 0:
                self._workers[head.chat_jid] = asyncio.create_task(
                    self._drain(head.chat_jid), name=f"outbox-{head.chat_jid}"
                )
            else:
                delay = min(delay, wait)
        return delay

    async def _drain(self, chat_jid: str) -> None:
        """Send the chat's due entries in order until none is due."""
        try:
            while not self._stopping:
                entry = outbox.chat_head(self._db.conn, chat_jid)
                if entry is None or _due(entry) > self._clock():
                    return
                await self._deliver(entry)
        except Exception:
            logger.exception(
                "outbox delivery to %s hit an unexpected error; trying again in %g s",
                chat_jid,
                self._backoff_cap,
                extra={"chat": chat_jid},
            )
            await asyncio.sleep(self._backoff_cap)  # holds the chat's slot: a persistent fault must not spin
        finally:
            if self._workers.get(chat_jid) is asyncio.current_task():
                del self._workers[chat_jid]
            self._wake.set()

    async def _deliver(self, entry: OutboxEntry) -> None:
        """One try at one entry; the outcome (sent, retry later, failed) is recorded before returning."""
        try:
            delivered = await send_entry(
                self._bot,
                entry,
                files_root=self._layout.outbox_files,
                remember=partial(self._remember, entry),
                reply_to=self._reply_to(entry),
            )
        except Undeliverable as err:
            self._give_up(entry, str(err))
            return
        except Exception as err:  # noqa: BLE001 - every failure is classified and recorded on the entry
            self._failed(entry, classify(err))
            return
        self._confirmed(entry, delivered)

    def _reply_to(self, entry: OutboxEntry) -> int | None:
        key = entry.options.get("reply_to_key")
        if not isinstance(key, str):
            return None
        return outbox.sent_message_id(self._db.conn, key, entry.chat_jid)

    def _remember(self, entry: OutboxEntry, options: dict[str, Any]) -> None:
        with self._db.tx() as conn:
            outbox.set_options(conn, entry.id, options)

    def _confirmed(self, entry: OutboxEntry, delivered: Delivered) -> None:
        message = delivered.message
        now = self._clock()
        with self._db.tx() as conn:
            if outbox.mark_sent(conn, entry.id, telegram_message_id=message.message_id, at=now):
                transcripts.append(
                    conn,
                    chat_jid=entry.chat_jid,
                    direction="out",
                    sender=self._sender(),
                    text=delivered.transcript_text,
                    at=now,
                    message_key=f"outbox:{entry.id}",
                )
        self._streaks.pop(entry.id, None)
        logger.debug(
            "outbox entry %d delivered to %s as message %d",
            entry.id,
            entry.chat_jid,
            message.message_id,
            extra=outbox_ids(entry),
        )
        if entry.kind == "file" and entry.file_path:
            try:
                Path(entry.file_path).unlink(missing_ok=True)
            except OSError as err:
                logger.warning("could not delete the sent copy %s: %s", entry.file_path, err)

    def _failed(self, entry: OutboxEntry, failure: Failure) -> None:
        """Record a failed try: wait, back off, or give up."""
        what = _describe(entry)
        if failure.kind is FailureKind.MIGRATED and self._follow(entry, failure):
            return
        if failure.kind in (FailureKind.PERMANENT, FailureKind.MIGRATED):
            self._give_up(entry, failure.reason)
            return
        if failure.kind is FailureKind.FLOOD:
            wait = failure.retry_after or self._settings.outbox_retry_seconds
            self._retry(entry, wait, failure.reason, counted=False)
            logger.warning("%s: %s; the chat waits %g s", what, failure.reason, wait, extra=outbox_ids(entry))
            return
        counted = failure.kind is FailureKind.RETRY
        attempts = entry.attempts + (1 if counted else 0)
        limit = self._settings.outbox_max_attempts
        if attempts >= limit:
            self._give_up(entry, f"gave up after {attempts} attempts: {failure.reason}")
            return
        streak = self._streaks.get(entry.id, entry.attempts) + 1
        self._streaks[entry.id] = streak
        wait = min(self._settings.outbox_retry_seconds * 2 ** (streak - 1), self._backoff_cap)
        self._retry(entry, wait, failure.reason, counted=counted)
        logger.warning(
            "%s not delivered: %s; retry in %g s (attempt %d of %d%s)",
            what,
            failure.reason,
            wait,
            attempts,
            limit,
            "" if counted else ", not counted",
            extra={**outbox_ids(entry), "attempt": attempts},
        )

    def _follow(self, entry: OutboxEntry, failure: Failure) -> bool:
        """Move the group of a chat that became a supergroup to its new id; False when nothing was moved."""
        assert failure.new_chat_id is not None
        new_jid = jid_of(failure.new_chat_id)
        with self._db.tx() as conn:
            moved = chat_moves.move_chat(conn, entry.chat_jid, new_jid)
        if moved is None:
            return False
        logger.warning("%s: the group %s became the supergroup %s; group %s and its undelivered messages follow it",
                       _describe(entry), entry.chat_jid, new_jid, moved.folder, extra=outbox_ids(entry))  # fmt: skip
        if self._on_groups_changed is not None:
            self._on_groups_changed()
        self._wake.set()
        return True

    def _retry(self, entry: OutboxEntry, wait: float, reason: str, *, counted: bool) -> None:
        with self._db.tx() as conn:
            outbox.schedule_retry(
                conn,
                entry.id,
                next_attempt_at=self._clock() + timedelta(seconds=wait),
                error=reason,
                count_attempt=counted,
            )

    def _give_up(self, entry: OutboxEntry, reason: str) -> None:
        with self._db.tx() as conn:
            count = outbox.mark_failed(conn, entry, error=reason)
        self._streaks.pop(entry.id, None)
        later = f" (and {count - 1} later chunk(s) of the message)" if count > 1 else ""
        logger.error("%s failed for good%s: %s", _describe(entry), later, reason, extra=outbox_ids(entry))

    def _sender(self) -> str:
        """The bot's @name once it is initialised (as the inbound side names users), else "farmhost"."""
        try:
            return self._bot.name
        except RuntimeError:
            return DEFAULT_SENDER


def _due(entry: OutboxEntry) -> datetime:
    return entry.next_attempt_at or entry.created_at


def _describe(entry: OutboxEntry) -> str:
    return f"outbox entry {entry.id} ({entry.kind} {entry.chunk_index + 1}/{entry.chunk_count} to {entry.chat_jid})"


def outbox_ids(entry: OutboxEntry) -> dict[str, object]:
    """The ids a log line about an outbox entry carries as `extra` (JSON logs show them as fields)."""
    ids: dict[str, object] = {"entryId": entry.id, "chat": entry.chat_jid}
    if entry.source_folder:
        ids["group"] = entry.source_folder
    return ids
