"""MessageStore: a routed message in a registered chat, stored with everything it starts, in one transaction.

The transcript row (edits as their own rows, marked "(edited)"), the chats row, and then either a queued run
(handed to ChatRuns once committed) or the update's row with a command reply queued in the outbox. Media is
fetched into the group's inbox first; a download failing on the network makes the whole update be retried
(MediaRetry, up to MEDIA_TRIES times), after which the message is stored with a note instead of the file.
A voice note is fetched and heard (voice_notes.py) before it is routed; one that is not transcribed is stored as
context with the reason, and the chat is told that reason instead of a run.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Final

from telegram import Message

from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.text import chat_name, one_line, sender_name
from farmhost.store import chats, telegram_state, transcripts
from farmhost.store.groups import Group
from farmhost.store.telegram_state import QueuedRun, UpdateStatus
from farmhost.telegram.inbound.chat_runs import ChatRuns
from farmhost.telegram.inbound.command_replies import CommandReplies
from farmhost.telegram.inbound.media import MediaRef, MediaRetry, Saved, placeholder, save_media
from farmhost.telegram.inbound.routing import Route
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts
from farmhost.telegram.inbound.voice_notes import BUSY, Heard, hear, refused

logger = logging.getLogger(INBOUND_LOGGER)

# A media download failing on the network is retried with its update this many times, then saved as a note only.
MEDIA_TRIES: Final = 3


class MessageStore:
    """Stores routed messages; remembers, per update, how often its media download failed."""

    def __init__(self, ports: InboundPorts, runs: ChatRuns, replies: CommandReplies) -> None:
        self._ports = ports
        self._runs = runs
        self._replies = replies
        self._media_failures: dict[int, int] = {}

    async def store(
        self,
        update_id: int,
        message: Message,
        group: Group,
        decision: Route,
        text: str,
        ref: MediaRef | None,
        *,
        edited: bool,
        heard: Heard | None = None,
    ) -> None:
        """Store `message` as `decision` says (run, command or context) and move the offset past it.

        `heard` is its voice note after `hear` (its media is then saved already).

        Raises:
            MediaRetry: its media could not be fetched (yet); the update is to be processed again.
        """
        ports = self._ports
        jid = group.jid
        body = text
        refusal: str | None = None  # a voice note meant for the agent that was not heard: the chat is told why
        if heard is not None:
            body = heard.body
            if heard.refusal is not None and decision.action == "run":
                refusal = heard.refusal
                decision = Route("store", "a voice note that was not transcribed")
        elif ref is not None:
            note = f"[{ref.kind}]" if edited else (await self._save_media(update_id, group, ref, message)).placeholder
            body = f"{note} {text}".strip()
        at = (message.edit_date if edited else None) or message.date
        key = f"tg:{message.chat.id}:{message.message_id}"
        if edited:
            body = f"(edited) {body}"
            key += f":edit:{int(at.timestamp())}"
        sender = sender_name(message)
        reply = None
        if decision.action == "command":
            sender_id = message.from_user.id if message.from_user is not None else None
            reply = await self._replies.reply(decision, group, sender, sender_id)
        queued: list[QueuedRun] = []

        def store(conn: sqlite3.Connection) -> None:
            chats.upsert_chat(conn, jid=jid, name=chat_name(message.chat), channel="telegram", seen_at=ports.clock())
            tid = transcripts.append(
                conn, chat_jid=jid, direction="in", sender=sender, text=body, at=at, message_key=key
            )
            status: UpdateStatus = "stored"
            if decision.action == "run" and tid is not None:
                after = telegram_state.consumed_through(conn, jid)
                telegram_state.queue_run(
                    conn, update_id=update_id, chat_jid=jid, transcript_id=tid, context_after=after, at=ports.clock()
                )
                telegram_state.consume_through(conn, jid, tid)
                queued.extend(telegram_state.queued_runs(conn, update_id))
                return
            if reply is not None:
                status = "command"
                enqueue_notice(
                    conn,
                    key=f"command:{update_id}",
                    jid=jid,
                    text=reply.text,
                    at=ports.clock(),
                    reply_markup=reply.reply_markup,
                )
            if refusal is not None:
                enqueue_notice(conn, key=f"voice:{update_id}", jid=jid, text=refusal, at=ports.clock())
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=jid, status=status, detail=decision.reason, at=ports.clock()
            )

        with ports.db.tx() as conn:
            store(conn)
            telegram_state.advance_offset(conn, update_id)
        self._media_failures.pop(update_id, None)
        if queued:
            logger.info("telegram: message %d in %s (%s) starts a run: %s", message.message_id, jid, group.folder,
                        decision.reason)  # fmt: skip
            self._runs.spawn(queued[0])
        if reply is not None or refusal is not None:
            ports.wake_outbox()

    async def hear(
        self, update_id: int, group: Group, ref: MediaRef, message: Message, *, busy: bool = False
    ) -> Heard | None:
        """Fetch a voice note into the inbox and transcribe it (None: no speech-to-text is configured).

        `busy`: too many updates wait to be handled; the note is kept but not heard, and the chat told so.

        Raises:
            MediaRetry: its media could not be fetched (yet); the update is to be processed again.
        """
        stt = self._ports.stt
        if stt is None:
            return None
        saved = await self._save_media(update_id, group, ref, message)
        if busy:
            return refused(saved.placeholder, message.caption or "", BUSY)
        return await hear(stt, ref, saved.placeholder, saved.data, message.caption or "")

    async def _save_media(self, update_id: int, group: Group, ref: MediaRef, message: Message) -> Saved:
        settings = self._ports.settings
        try:
            return await save_media(
                self._ports.bot,
                ref,
                self._ports.layout.workspace(group.folder),
                message_id=message.message_id,
                local_time=message.date.astimezone(settings.zone),
                max_bytes=settings.media_max_bytes,
            )
        except MediaRetry as err:
            tries = self._media_failures.get(update_id, 0) + 1
            if tries < MEDIA_TRIES:
                self._media_failures[update_id] = tries
                raise
            self._media_failures.pop(update_id, None)
            logger.warning("telegram: giving up on the %s of message %d: %s", ref.kind, message.message_id, err)
            return Saved(placeholder(ref, f"(not saved: {one_line(str(err))})"))
