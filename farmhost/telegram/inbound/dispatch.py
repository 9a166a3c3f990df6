"""Dispatch of one update: dropped when seen before, else to the button, message or membership handler.

A message is routed (routing.py) here: ignored (the chat recorded as seen), offered for approval when its chat
is not registered (membership.py), or stored as context, a run or a command (message_store.py). Edits never start
a run or answer a command. A voice note in a registered chat is heard first (voice_notes.py) and routed by its words,
as if they had been typed.
"""

from __future__ import annotations

import logging

from telegram import Message, Update, User

from farmhost.store import groups, telegram_state
from farmhost.telegram.bot import jid_of
from farmhost.telegram.inbound import membership
from farmhost.telegram.inbound.buttons import on_callback
from farmhost.telegram.inbound.media import MediaRef, media_of
from farmhost.telegram.inbound.message_store import MessageStore
from farmhost.telegram.inbound.routing import Incoming, Route, parse_command, route
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts
from farmhost.telegram.inbound.voice_notes import is_voice

logger = logging.getLogger(INBOUND_LOGGER)


async def handle(ports: InboundPorts, messages: MessageStore, update: Update, *, busy: bool = False) -> None:
    """Process one update and move the offset past it (unless it is to be retried: MediaRetry, sqlite3.Error).

    `busy`: too many updates wait already (chat_queues.py); a voice note is then answered that the farm is busy
    instead of being heard.
    """
    if telegram_state.seen(ports.db.conn, update.update_id):
        logger.info("telegram: update %d was delivered again; dropped", update.update_id)
        with ports.db.tx() as conn:
            telegram_state.advance_offset(conn, update.update_id)
        return
    if update.callback_query is not None:
        await on_callback(ports, update.update_id, update.callback_query)
    elif update.message is not None:
        await on_message(ports, messages, update.update_id, update.message, edited=False, busy=busy)
    elif update.edited_message is not None:
        await on_message(ports, messages, update.update_id, update.edited_message, edited=True)
    elif update.my_chat_member is not None:
        membership.on_membership(ports, update.update_id, update.my_chat_member)
    else:
        ports.finish(update.update_id, None, "ignored", "an update type farmhost does not handle")


async def on_message(
    ports: InboundPorts, messages: MessageStore, update_id: int, message: Message, *, edited: bool, busy: bool = False
) -> None:
    """Route a new or edited message and act on the decision."""
    if membership.is_migration(message):
        await membership.on_migration(ports, update_id, message)
        return
    chat = message.chat
    jid = jid_of(chat.id)
    group = groups.find_by_jid(ports.db.conn, jid)
    text = message.text or message.caption or ""
    ref = media_of(message, max_bytes=ports.settings.media_max_bytes)
    sender = message.from_user
    if not text and ref is None:
        ports.finish(update_id, jid, "ignored", "no text or media (a service message)", ports.seen_chat(chat))
        return
    heard = None
    if group is not None and not edited and _hearable(ports, group, ref, sender):
        assert ref is not None
        heard = await messages.hear(update_id, group, ref, message, busy=busy)
        if heard is not None:
            text = heard.text
    incoming = Incoming(
        text=text,
        chat_type=chat.type,
        sender_id=sender.id if sender else None,
        sender_is_bot=bool(sender and sender.is_bot and message.sender_chat is None),
        reply_to_bot=_replies_to_bot(ports, message),
    )
    decision = route(
        group, incoming, bot_username=ports.bot.username, bot_id=ports.bot.id, main_senders=ports.main_senders
    )
    if edited and decision.action in ("run", "command"):
        decision = Route("store", "an edited message: context only")
    if decision.action == "ignore" or (edited and decision.action == "offer"):
        level = logging.INFO if group is not None else logging.DEBUG
        logger.log(level, "telegram: message %d in %s ignored: %s", message.message_id, jid, decision.reason)
        ports.finish(update_id, jid, "ignored", decision.reason, ports.seen_chat(chat))
    elif decision.action == "offer":
        membership.offer(ports, update_id, chat, sender)
    else:
        assert group is not None
        await messages.store(update_id, message, group, decision, text, ref, edited=edited, heard=heard)


def chat_of(update: Update) -> str | None:
    """The chat whose order an update keeps (a message or an edit); None for buttons and membership changes."""
    message = update.message or update.edited_message
    return jid_of(message.chat.id) if message is not None else None


def must_hear(ports: InboundPorts, update: Update) -> bool:
    """Whether the update is a voice note that will be transcribed (what on_message hears before routing)."""
    message = update.message
    if message is None or ports.stt is None:
        return False
    group = groups.find_by_jid(ports.db.conn, jid_of(message.chat.id))
    ref = media_of(message, max_bytes=ports.settings.media_max_bytes)
    return group is not None and _hearable(ports, group, ref, message.from_user)


def is_stop(ports: InboundPorts, update: Update) -> bool:
    """Whether the update is `/stop` in the main chat: it makes the farm safe, so it waits for nothing."""
    message = update.message
    if message is None or not message.text:
        return False
    group = groups.find_by_jid(ports.db.conn, jid_of(message.chat.id))
    command = parse_command(message.text, ports.bot.username)
    return group is not None and group.is_main and command is not None and command[0] == "stop"


def _hearable(ports: InboundPorts, group: groups.Group, ref: MediaRef | None, sender: User | None) -> bool:
    """Whether a message of a registered group is a voice note on_message hears before routing.

    One test for on_message and `must_hear`, which queues the note beside the polling loop: they must never disagree.
    """
    return is_voice(ref) and _may_speak(ports, group.is_main, sender)


def _may_speak(ports: InboundPorts, is_main: bool, sender: User | None) -> bool:
    """Whether a voice note is worth hearing: routing ignores bots, and other senders than the main chat's own."""
    if sender is not None and sender.is_bot:
        return False
    return not (is_main and ports.main_senders and (sender is None or sender.id not in ports.main_senders))


def _replies_to_bot(ports: InboundPorts, message: Message) -> bool:
    replied = message.reply_to_message
    return bool(replied and replied.from_user and replied.from_user.id == ports.bot.id)
