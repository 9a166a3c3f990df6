"""ChatQueues: updates that wait for an earlier update of their chat (a voice note being heard), in order, aside.

Hearing a voice note takes up to 20 s + 4 × its length. Done in the polling loop, it held every other chat, every
button and `/stop` that long. So a note that will be heard is deferred: it and every later update of its chat go
to that chat's queue, which a task of its own works through, one update at a time, in order; the polling loop
goes on with the other chats' updates, the buttons (Approve, Acknowledge, Stop everything) and the membership
changes. `/stop` in the main chat waits for nothing, not even a note of the main chat itself: it only makes things
safe, and a farmer who says a note and then types `/stop` wants the stop now. Every other later update of a chat
(`/resume` too) keeps its place behind the note.

A deferred update is kept in the database (`telegram_deferred`, its raw JSON) in the same transaction that moves
the offset past it, so Telegram is told it arrived and a kill -9 loses nothing: at start the kept updates are read
back into their queues. Once handled (its `telegram_updates` row committed) it is deleted; one handled but not yet
deleted when farmhost died is found in `telegram_updates` at the restart and dropped, so none is handled twice.

Bounded: MAX_PER_CHAT waiting updates in a chat and MAX_WAITING in all. Past that an update is handled at once,
out of its chat's order (logged), and a voice note is then not heard: the chat is told the farm is busy.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final, Literal

from telegram import Update

from farmhost.outbox.text import describe_error
from farmhost.store import telegram_state
from farmhost.telegram.inbound.dispatch import chat_of, is_stop, must_hear
from farmhost.telegram.inbound.media import MediaRetry
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts, retry_delay

logger = logging.getLogger(INBOUND_LOGGER)

# About half an hour of two-minute notes in one chat; more is a flood, not a farmer talking.
MAX_PER_CHAT: Final = 20
# The engine hears one note at a time: this many waiting in all is already hours of work.
MAX_WAITING: Final = 100

# The handler of one update; its flag says the farm is busy (a voice note is then not heard).
UpdateHandler = Callable[[Update, bool], Awaitable[None]]
Way = Literal["now", "busy", "deferred"]


class ChatQueues:
    """Per-chat queues of deferred updates, each worked through in order by a task of its own."""

    def __init__(
        self,
        ports: InboundPorts,
        handle: UpdateHandler,
        *,
        retry_delays: tuple[float, float],
        max_per_chat: int = MAX_PER_CHAT,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self._ports = ports
        self._handle = handle
        self._retry_delays = retry_delays
        self._max_per_chat = max_per_chat
        self._max_waiting = max_waiting
        self._queues: dict[str, deque[Update]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def waiting(self) -> int:
        """How many updates wait in all the queues."""
        return sum(len(queue) for queue in self._queues.values())

    def resume(self) -> None:
        """Read back the updates a stop or a crash left waiting and start on them (once the bot is connected)."""
        kept = telegram_state.deferred_updates(self._ports.db.conn)
        queued = {update.update_id for queue in self._queues.values() for update in queue}
        for row in kept:
            if row.update_id in queued:
                continue
            try:
                update = Update.de_json(row.raw, self._ports.bot)
            except Exception as err:  # noqa: BLE001 - whatever PTB raised, this one update is recorded and dropped
                logger.error("telegram: deferred update %d is not readable and is skipped: %s", row.update_id,
                             describe_error(err))  # fmt: skip
                self._ports.finish(
                    row.update_id, row.chat_jid, "error", describe_error(err), self._dropper(row.update_id)
                )
                continue
            self._enqueue(row.chat_jid, update)
        if kept:
            logger.info("telegram: %d update(s) deferred before the restart are handled now", len(kept))

    def offer(self, update: Update) -> Way:
        """Defer `update` when its chat waits or it is a voice note to hear; else say how to handle it now.

        Raises:
            sqlite3.Error: it could not be kept; the poll is retried from it.
        """
        jid = chat_of(update)
        if jid is None:
            return "now"
        waiting = self._queues.get(jid)
        if waiting is None and not must_hear(self._ports, update):
            return "now"
        if waiting is not None and is_stop(self._ports, update):
            logger.info("telegram: /stop (update %d) is handled before the %d update(s) its chat waits for",
                        update.update_id, len(waiting))  # fmt: skip
            return "now"
        if telegram_state.seen(self._ports.db.conn, update.update_id):
            return "now"  # handled before: dispatch drops it
        if len(waiting or ()) >= self._max_per_chat or self.waiting >= self._max_waiting:
            logger.warning(
                "telegram: update %d of %s is handled at once, out of its chat's order: %d update(s) wait in that "
                "chat and %d in all (at most %d and %d); a voice note is answered that the farm is busy",
                update.update_id, jid, len(waiting or ()), self.waiting, self._max_per_chat, self._max_waiting,
            )  # fmt: skip
            return "busy"
        with self._ports.db.tx() as conn:
            kept = telegram_state.defer_update(
                conn, update_id=update.update_id, chat_jid=jid, raw=update.to_dict(), at=self._ports.clock()
            )
            telegram_state.advance_offset(conn, update.update_id)
        if kept:
            logger.info("telegram: update %d of %s is handled beside the polling loop, after %d earlier one(s)",
                        update.update_id, jid, len(waiting or ()))  # fmt: skip
            self._enqueue(jid, update)
        return "deferred"

    async def stop(self) -> None:
        """Stop working on the queues; what waits stays in the database for the next start."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._queues.clear()

    def _enqueue(self, jid: str, update: Update) -> None:
        queue = self._queues.setdefault(jid, deque())
        queue.append(update)
        if jid not in self._tasks:
            self._tasks[jid] = asyncio.create_task(self._drain(jid, queue), name=f"telegram:chat {jid}")

    async def _drain(self, jid: str, queue: deque[Update]) -> None:
        while queue:
            update = queue[0]
            await self._handle_one(jid, update)
            queue.popleft()
        # no await since the last check: an update deferred meanwhile found this queue and is in it
        del self._queues[jid]
        del self._tasks[jid]

    async def _handle_one(self, jid: str, update: Update) -> None:
        """Handle one deferred update until it is done (retried on the network and the database), then forget it."""
        failures = 0
        handled = False
        while True:
            try:
                if not handled:
                    await self._handle(update, False)
                    handled = True
                with self._ports.db.tx() as conn:
                    telegram_state.drop_deferred(conn, update.update_id)
                return
            except (MediaRetry, sqlite3.Error) as err:
                failures += 1
                level = logging.WARNING if failures == 1 else logging.DEBUG
                logger.log(level, "telegram: deferred update %d failed (%d): %s; retrying", update.update_id, failures,
                           describe_error(err))  # fmt: skip
            except asyncio.CancelledError:
                raise
            except Exception as err:  # logged with its traceback and recorded: it never blocks the chat
                logger.error("telegram: update %d could not be processed and is skipped: %s", update.update_id,
                             describe_error(err), exc_info=err)  # fmt: skip
                try:
                    self._ports.finish(
                        update.update_id, jid, "error", describe_error(err), self._dropper(update.update_id)
                    )
                    return
                except sqlite3.Error:
                    failures += 1
            await asyncio.sleep(retry_delay(self._retry_delays, failures))

    @staticmethod
    def _dropper(update_id: int) -> Callable[[sqlite3.Connection], None]:
        def work(conn: sqlite3.Connection) -> None:
            telegram_state.drop_deferred(conn, update_id)

        return work
