"""Chats that are not registered yet: offering them to the main chat, and the bot joining or leaving a chat.

An unregistered chat that addresses the bot, or a group that adds it, is offered once for approval
(approvals.offer, which queues the question to the main chat and a hello to the chat); the answer is a button
press (callbacks.py). The bot being removed from a registered group only warns: the registration stays.
"""

from __future__ import annotations

import logging
import sqlite3

from telegram import Chat, ChatMemberUpdated, User

from farmhost.outbox.text import chat_name, user_name
from farmhost.store import groups, telegram_state
from farmhost.telegram.bot import jid_of
from farmhost.telegram.inbound import new_chats as approvals
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts

logger = logging.getLogger(INBOUND_LOGGER)


def offer(ports: InboundPorts, update_id: int, chat: Chat, requester: User | None) -> None:
    """Offer `chat` to the main chat for approval, recorded with the update in one transaction."""
    jid = jid_of(chat.id)
    outcome: list[str] = []

    def work(conn: sqlite3.Connection) -> None:
        ports.seen_chat(chat)(conn)
        outcome.append(
            approvals.offer(
                conn,
                jid=jid,
                title=chat_name(chat) or jid,
                requested_by=user_name(requester),
                key=str(update_id),
                at=ports.clock(),
            )
        )

    with ports.db.tx() as conn:
        work(conn)
        telegram_state.record_update(
            conn, update_id=update_id, chat_jid=jid, status="offered", detail=outcome[0], at=ports.clock()
        )
        telegram_state.advance_offset(conn, update_id)
    logger.info("telegram: unregistered chat %s (%s) asked for the bot: %s", jid, chat_name(chat), outcome[0])
    ports.wake_outbox()


def on_membership(ports: InboundPorts, update_id: int, change: ChatMemberUpdated) -> None:
    """The bot's own membership changed (my_chat_member): an offer when it joined an unregistered group."""
    chat = change.chat
    jid = jid_of(chat.id)
    old, new = change.old_chat_member.status, change.new_chat_member.status
    joined = new in ("member", "administrator") and old in ("left", "kicked")
    group = groups.find_by_jid(ports.db.conn, jid)
    if joined and group is None and chat.type in ("group", "supergroup"):
        offer(ports, update_id, chat, change.from_user)
        return
    if new in ("left", "kicked") and group is not None:
        logger.warning(
            "telegram: the bot was removed from %s (folder %s); the group stays registered "
            "(`farmhost group remove %s` unregisters it)",
            jid,
            group.folder,
            group.folder,
        )
    ports.finish(update_id, jid, "ignored", f"the bot's membership changed: {old} -> {new}", ports.seen_chat(chat))
