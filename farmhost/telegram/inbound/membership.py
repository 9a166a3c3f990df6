"""Chats coming and going: offers to the main chat, the bot joining or leaving a chat, a group's new id.

An unregistered chat that addresses the bot, or a group that adds it, is offered once for approval
(approvals.offer, which queues the question to the main chat and a hello to the chat); the answer is a button
press (callbacks.py). The bot being removed from a registered group only warns: the registration stays.

A group upgraded to a supergroup gets a new id from Telegram, and its old id is dead (sends to it are refused).
Telegram says so with a service message in each chat (`migrate_to_chat_id` in the old one, `migrate_from_chat_id`
in the new one, in no promised order); the first one seen moves the registration and everything keyed by the
chat to the new id (store/chat_moves.py), so the group keeps its folder, context and undelivered messages, and
the main chat stays the main chat. The second one finds nothing left to move.
"""

from __future__ import annotations

import logging
import sqlite3

from telegram import Chat, ChatMemberUpdated, Message, User

from farmhost.outbox.text import chat_name, user_name
from farmhost.store import chat_moves, groups, telegram_state
from farmhost.telegram.bot import jid_of
from farmhost.telegram.inbound import commands
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


def is_migration(message: Message) -> bool:
    """Whether `message` is Telegram's notice that a group became a supergroup (in either of the two chats)."""
    return message.migrate_to_chat_id is not None or message.migrate_from_chat_id is not None


async def on_migration(ports: InboundPorts, update_id: int, message: Message) -> None:
    """A group became a supergroup: its registration (and all that hangs on it) follows it to the new id."""
    chat = message.chat
    if message.migrate_to_chat_id is not None:
        old, new = jid_of(chat.id), jid_of(message.migrate_to_chat_id)
    else:
        assert message.migrate_from_chat_id is not None
        old, new = jid_of(message.migrate_from_chat_id), jid_of(chat.id)
    moved: list[groups.Group] = []

    def work(conn: sqlite3.Connection) -> None:
        if (group := chat_moves.move_chat(conn, old, new)) is not None:
            moved.append(group)
        if jid_of(chat.id) == new:
            ports.seen_chat(chat)(conn)

    detail = f"the group {old} became the supergroup {new}"
    # `work` runs inside `finish`, after the status is taken: whether a group is there to move is known now (the
    # outbox may have moved it already, on a send refused with the new id).
    follows = groups.find_by_jid(ports.db.conn, old) is not None
    ports.finish(update_id, jid_of(chat.id), "stored" if follows else "ignored", detail, work)
    if moved:
        logger.warning("telegram: %s; group %s follows it (its folder, context and undelivered messages)",
                       detail, moved[0].folder)  # fmt: skip
        if ports.on_groups_changed is not None:
            ports.on_groups_changed()
        ports.wake_outbox()
    # The outbox may have moved the group first (a send to the old id): the main chat's menu follows it here.
    group = groups.find_by_jid(ports.db.conn, new)
    if group is not None and group.is_main and (failed := await commands.set_menus(ports.bot, group)) is not None:
        logger.warning("telegram: the main chat's command menu was not moved (%s)", failed)
