"""ChatRuns: the agent run of each triggered chat message, from its queued row to the reply in the outbox.

A triggered message is stored `queued` (telegram_state.queue_run) by the inbound loop, which hands it here. The
run is submitted from a background task (nobody waits for an agent); the typing indicator goes every few seconds
meanwhile; the outcome and its reply are stored in one transaction. The submit is shielded: stopping this service
never cancels a run under the runtime (that would orphan the agent process), the runtime ends its own runs when
it stops, and a row whose outcome was not recorded stays `queued` and is submitted again at the next start. A row
is submitted at most MAX_ATTEMPTS times; then it is failed with a message to the chat. The reply to a voice note
starts with the words that were understood.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import Final, Literal

from telegram import Bot
from telegram.constants import ChatAction

from farmhost.agents.fallback import ASSISTANT_NAME, NOTICE_KEY, assist_notice
from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.runtime import AgentRuntime
from farmhost.config import TelegramSettings
from farmhost.outbox.notices import enqueue_answer, enqueue_notice
from farmhost.outbox.text import one_line
from farmhost.store import chat_notices, groups, telegram_state
from farmhost.store.db import Database
from farmhost.store.telegram_state import QueuedRun
from farmhost.telegram.bot import chat_id_of
from farmhost.telegram.inbound.photos import photo_path
from farmhost.telegram.inbound.prompt import CONTEXT_MESSAGES, build_prompt
from farmhost.telegram.inbound.routing import COMMANDS, parse_command
from farmhost.telegram.inbound.voice_notes import quote, spoken_words

logger = logging.getLogger(__name__)

# The first submit, and one more after a restart interrupted it.
MAX_ATTEMPTS: Final = 2
# Telegram shows "typing" for 5 s after each chat action.
TYPING_INTERVAL: Final = 4.0
ERROR_CHARS: Final = 300
INTERRUPTED: Final = "I couldn't finish that: farmhost restarted while I was working on it. Please ask again."


class ChatRuns:
    """Runs triggered chat messages through the agent runtime and queues the replies."""

    def __init__(
        self,
        *,
        db: Database,
        settings: TelegramSettings,
        bot: Bot,
        runtime: AgentRuntime,
        wake_outbox: Callable[[], None],
        clock: Callable[[], datetime],
        typing_interval: float = TYPING_INTERVAL,
    ) -> None:
        self._db = db
        self._settings = settings
        self._bot = bot
        self._runtime = runtime
        self._wake_outbox = wake_outbox
        self._clock = clock
        self._typing_interval = typing_interval
        self._tasks: set[asyncio.Task[None]] = set()
        self._submits: set[asyncio.Future[AgentOutcome]] = set()

    def resume(self) -> int:
        """Start every run whose outcome was never recorded (a stop or crash came first); returns how many."""
        unfinished = telegram_state.queued_runs(self._db.conn)
        if unfinished:
            logger.info("telegram: %d triggered message(s) had no finished run; running them now", len(unfinished))
        for run in unfinished:
            self.spawn(run)
        return len(unfinished)

    def spawn(self, run: QueuedRun) -> None:
        """Run a queued message in the background."""
        task = asyncio.create_task(self._run(run), name=f"telegram:run:{run.update_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Stop following runs (typing ends; runs already submitted go on in the runtime, their rows stay queued)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, run: QueuedRun) -> None:
        try:
            await self._run_once(run)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("telegram: the run of update %d failed; it runs again at the next start", run.update_id)

    async def _run_once(self, run: QueuedRun) -> None:
        with self._db.tx() as conn:
            prepared = self._prepare(conn, run)
        if prepared is None:
            self._wake_outbox()
            return
        job, heard = prepared
        typing = asyncio.create_task(self._typing(chat_id_of(run.chat_jid)), name=f"telegram:typing:{run.chat_jid}")
        try:
            outcome = await self._submit(job)
        finally:
            typing.cancel()
            await asyncio.gather(typing, return_exceptions=True)
        if outcome.status == "cancelled" and (paused := self._runtime.paused) is not None:
            # Paused (the MQTT switch, /stop): answered and finished, never kept to run after /resume or a restart.
            with self._db.tx() as conn:
                if telegram_state.finish_run(conn, run.update_id, status="failed", note="paused"):
                    enqueue_notice(conn, key=f"reply:{outcome.run_id}", jid=run.chat_jid, text=paused_text(paused),
                                   at=self._clock())  # fmt: skip
            self._wake_outbox()
            return
        if outcome.status == "cancelled":
            logger.info("telegram: the run for update %d was cancelled (%s); it runs again at the next start",
                        run.update_id, outcome.error)  # fmt: skip
            return
        text, status = reply_text(outcome)
        if outcome.receipt:  # farmhost's own account, under the agent's words (alone when it said nothing)
            text = f"{text}\n\n{outcome.receipt}" if text else outcome.receipt
        if outcome.photo_note:  # the model did not see the message's photo, and why
            text = f"{text}\n\n{outcome.photo_note}" if text else outcome.photo_note
        if text and heard is not None:  # a voice note: what was understood comes first
            text = f"{quote(heard)}\n\n{text}"
        with self._db.tx() as conn:
            if telegram_state.finish_run(conn, run.update_id, status=status, note=outcome.status) and text:
                key, at = f"reply:{outcome.run_id}", self._clock()
                if outcome.answered_by == ASSISTANT_NAME:  # plain text, as Assist speaks it; told once per chat
                    if chat_notices.give_once(conn, jid=run.chat_jid, notice=NOTICE_KEY, at=at):
                        notice = assist_notice(outcome.fallback_why)
                        enqueue_notice(conn, key=f"notice:{NOTICE_KEY}:{run.chat_jid}", jid=run.chat_jid, text=notice,
                                       at=at)  # fmt: skip
                    enqueue_notice(conn, key=key, jid=run.chat_jid, text=text, at=at)
                elif status == "done":
                    enqueue_answer(conn, key=key, jid=run.chat_jid, folder=job.folder, text=text, at=at)
                else:
                    enqueue_notice(conn, key=key, jid=run.chat_jid, text=text, at=at)
        self._wake_outbox()

    def _prepare(self, conn: sqlite3.Connection, run: QueuedRun) -> tuple[AgentJob, str | None] | None:
        """The job of a queued run (counting the attempt) and a voice note's words; None when it cannot run.

        A run that cannot run is finished here.
        """
        group = groups.find_by_jid(conn, run.chat_jid)
        trigger = telegram_state.transcript_message(conn, run.transcript_id)
        if group is None or trigger is None:
            telegram_state.finish_run(conn, run.update_id, status="failed", note="the chat is no longer registered")
            return None
        if run.attempts >= MAX_ATTEMPTS:
            telegram_state.finish_run(conn, run.update_id, status="failed", note="interrupted by restarts")
            enqueue_notice(
                conn, key=f"interrupted:{run.update_id}", jid=run.chat_jid, text=INTERRUPTED, at=self._clock()
            )
            return None
        run = telegram_state.count_attempt(conn, run)
        context, omitted = telegram_state.context_messages(
            conn, run.chat_jid, after=run.context_after, before=run.transcript_id, limit=CONTEXT_MESSAGES
        )
        username = self._username()
        context = [message for message in context if not _is_command(message.text, username)]
        prompt = build_prompt(trigger, context, zone=self._settings.zone, omitted=omitted)
        words = spoken_words(trigger.text)
        job = AgentJob(
            folder=group.folder,
            prompt=prompt,
            scheduled=False,
            context_mode="group",
            chat_jid=group.jid,
            message=trigger.text if words is None else words,  # Assist hears the words, not the placeholder
            photo=photo_path(trigger.text),
        )
        return job, words

    async def _submit(self, job: AgentJob) -> AgentOutcome:
        submitted = asyncio.ensure_future(self._runtime.submit(job))
        self._submits.add(submitted)  # a strong reference while it runs on after a stop
        submitted.add_done_callback(self._submitted)
        return await asyncio.shield(submitted)

    def _submitted(self, future: asyncio.Future[AgentOutcome]) -> None:
        self._submits.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("telegram: an agent run raised: %r", future.exception())

    async def _typing(self, chat_id: int) -> None:
        while True:
            try:
                await self._bot.send_chat_action(chat_id, ChatAction.TYPING)
            except Exception as err:  # noqa: BLE001 - cosmetic: a failed typing indicator must never touch the run
                logger.debug("telegram: typing indicator for %d failed: %s", chat_id, err)
            await asyncio.sleep(self._typing_interval)

    def _username(self) -> str:
        """The bot's username ("" before getMe succeeded: runs resumed at start may come first)."""
        with contextlib.suppress(RuntimeError):
            return self._bot.username
        return ""


def reply_text(outcome: AgentOutcome) -> tuple[str, Literal["done", "failed"]]:
    """What the chat is told about a finished run, and the row's status: the answer, or one short human line."""
    if outcome.status == "ok":
        return (outcome.answer or "").strip(), "done"
    first = (outcome.error or "").strip().splitlines()
    error = one_line(first[0] if first else f"the run ended with {outcome.status}", ERROR_CHARS)
    return f"I couldn't finish that: {error}", "failed"


def paused_text(reason: str) -> str:
    """What a chat is told about its message while agent runs are paused."""
    return f"Agents are paused ({reason}): nothing more is done for this message. Send it again after /resume."


def _is_command(text: str, bot_username: str) -> bool:
    parsed = parse_command(text, bot_username)
    return parsed is not None and parsed[0] in COMMANDS
