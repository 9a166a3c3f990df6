"""Button presses (callback queries): dispatched by the prefix of their data, one handler per kind of button.

Four kinds: the chat-connection approvals (`approve:telegram:<id>` / `reject:telegram:<id>`, approvals.py), the
farm-action approvals (`fa:<approval id>:y|n`, farm/control/approval_desk.py), the emergency stop (`stop:all`, stop.py) and
the farm alerts' Acknowledge / Snooze 1 h (`al:<notice id>:ack|snooze`, farm/state/alert_notifier.py).
Another kind is one more entry in HANDLERS: a prefix and an async function taking (ports, update_id, query) that
records the update (InboundPorts.finish or its own transaction with the offset) and answers the press. Data no
handler knows is recorded as ignored and answered "This button is not used any more." In the main chat only its
members decide (main_members.py); anyone else's press is refused, changes nothing and is told why.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from telegram import CallbackQuery, Message
from telegram.error import TelegramError

from farmhost.errors import FarmhostError
from farmhost.farm.control import approval_requests as asking
from farmhost.farm.control.approval_desk import Presser
from farmhost.farm.state import alert_notifier as alert_notify
from farmhost.outbox import stop_messages as stop
from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.text import one_line, user_name
from farmhost.store import groups, telegram_state
from farmhost.telegram.bot import jid_of
from farmhost.telegram.inbound import new_chats as approvals
from farmhost.telegram.inbound.update_context import INBOUND_LOGGER, InboundPorts

logger = logging.getLogger(INBOUND_LOGGER)

CallbackHandler = Callable[[InboundPorts, int, CallbackQuery], Awaitable[None]]

UNUSED_BUTTON: Final = "This button is not used any more."


async def on_callback(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """Hand a button press to the handler of its data's prefix (the part before the first `:`)."""
    prefix = (query.data or "").split(":", 1)[0]
    handler = HANDLERS.get(prefix, unknown_button)
    await handler(ports, update_id, query)


async def unknown_button(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """A button whose data no handler reads (an old message, a kind since removed, forged data)."""
    ports.finish(update_id, _chat_jid(query), "ignored", f"unknown button data {one_line(query.data, 80)!r}")
    await ports.answer(query, UNUSED_BUTTON)


async def on_chat_connection(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """Approve / Reject of a chat asking to be connected: only in the main chat, by its members."""
    parsed = approvals.parse_callback(query.data)
    if parsed is None:
        await unknown_button(ports, update_id, query)
        return
    message = query.message
    chat_jid = _chat_jid(query)
    main = groups.main_group(ports.db.conn)
    who = user_name(query.from_user)
    choice, jid = parsed
    if main is None or chat_jid != main.jid:
        ports.finish(update_id, chat_jid, "refused", f"{choice} {jid} pressed outside the main chat by {who}")
        await ports.answer(query, "Only the farm's main chat can approve chats.")
        return
    if (refusal := await _not_member(ports, query)) is not None:
        ports.finish(update_id, chat_jid, "refused", f"{choice} {jid} by {who}: {refusal}")
        await ports.answer(query, refusal)
        return
    try:
        with ports.db.tx() as conn:
            decision = approvals.decide(
                conn,
                ports.layout,
                choice=choice,
                jid=jid,
                decided_by=who,
                bot_username=ports.bot.username,
                key=str(update_id),
                at=ports.clock(),
            )
            telegram_state.record_update(
                conn, update_id=update_id, chat_jid=chat_jid, status="callback", detail=decision.answer,
                at=ports.clock(),
            )  # fmt: skip
            telegram_state.advance_offset(conn, update_id)
    except (FarmhostError, OSError) as err:
        reason = err.message if isinstance(err, FarmhostError) else f"cannot create its folders: {err}"
        logger.error("telegram: approving %s failed: %s", jid, reason)
        ports.finish(update_id, chat_jid, "error", reason)
        await ports.answer(query, f"Could not connect {jid}: {reason}")
        return
    logger.info("telegram: %s pressed %s for %s: %s", who, choice, jid, decision.answer)
    if decision.group is not None:
        if ports.on_groups_changed is not None:
            ports.on_groups_changed()
        ports.wake_outbox()
    await ports.answer(query, decision.answer)
    if decision.note and isinstance(message, Message) and message.text:
        try:
            await ports.bot.edit_message_text(
                f"{message.text}\n\n{decision.note}", chat_id=message.chat.id, message_id=message.message_id
            )
        except TelegramError as err:
            logger.warning("telegram: cannot update the approval message: %s", err)


async def on_farm_action(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """Approve / Deny of a farm action under approval (farm/control/approval_desk.py decides; the press is answered first)."""
    parsed = asking.parse_callback(query.data)
    if parsed is None or ports.desk is None:
        await unknown_button(ports, update_id, query)
        return
    approval_id, choice = parsed
    chat_jid = _chat_jid(query)
    main = groups.main_group(ports.db.conn)
    in_main_chat = main is not None and chat_jid == main.jid
    presser = Presser(
        user_id=query.from_user.id,
        who=user_name(query.from_user),
        in_main_chat=in_main_chat,
        not_member=await _not_member(ports, query) if in_main_chat else None,
    )
    press = ports.desk.press(approval_id, choice, presser)
    ports.finish(update_id, chat_jid, "callback", f"{approval_id} {choice} by {presser.who}: {press.answer}")
    await ports.answer(query, press.answer)
    note = press.note if press.run is None else await press.run
    message = query.message
    if note and presser.in_main_chat and isinstance(message, Message) and message.text:
        try:
            await ports.bot.edit_message_text(
                f"{message.text}\n\n{note}", chat_id=message.chat.id, message_id=message.message_id
            )
        except TelegramError as err:
            logger.warning("telegram: cannot update the approval message: %s", err)


async def on_stop(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """Stop everything: in the main chat only, by its members, exactly as /stop; the report goes to the chat."""
    if not stop.is_stop_callback(query.data) or ports.stop is None:
        await unknown_button(ports, update_id, query)
        return
    chat_jid = _chat_jid(query)
    main = groups.main_group(ports.db.conn)
    who = user_name(query.from_user)
    if main is None or chat_jid != main.jid:
        ports.finish(update_id, chat_jid, "refused", f"Stop everything pressed outside the main chat by {who}")
        await ports.answer(query, "Only the farm's main chat can stop everything.")
        return
    if (refusal := await _not_member(ports, query)) is not None:
        ports.finish(update_id, chat_jid, "refused", f"Stop everything by {who}: {refusal}")
        await ports.answer(query, refusal)
        return
    await ports.answer(query, "Stopping everything now; the report follows in the chat.")
    report = await ports.stop.stop(by=who, via="button")
    text = stop.stop_text(report)

    def tell(conn: sqlite3.Connection) -> None:
        enqueue_notice(
            conn, key=f"stop:{update_id}", jid=main.jid, text=text, at=ports.clock(), reply_markup=stop.stop_keyboard()
        )

    ports.finish(update_id, chat_jid, "callback", f"Stop everything by {who}", tell)
    ports.wake_outbox()


async def on_alert(ports: InboundPorts, update_id: int, query: CallbackQuery) -> None:
    """Acknowledge / Snooze 1 h of a farm alert: in the chat it was told to (the main chat: by its members)."""
    parsed = alert_notify.parse_callback(query.data)
    if parsed is None or ports.alerts is None:
        await unknown_button(ports, update_id, query)
        return
    notice_id, choice = parsed
    chat_jid = _chat_jid(query)
    who = user_name(query.from_user)
    main = groups.main_group(ports.db.conn)
    if main is not None and chat_jid == main.jid and (refusal := await _not_member(ports, query)) is not None:
        ports.finish(update_id, chat_jid, "refused", f"alert {notice_id} {choice} by {who}: {refusal}")
        await ports.answer(query, refusal)
        return
    if choice == alert_notify.ACK:
        answer = ports.alerts.acknowledge(notice_id, chat_jid, who)
    else:
        answer = ports.alerts.snooze(notice_id, chat_jid, who)
    ports.finish(update_id, chat_jid, "callback", f"alert {notice_id} {choice} by {who}: {answer}")
    await ports.answer(query, answer)


async def _not_member(ports: InboundPorts, query: CallbackQuery) -> str | None:
    """Why the presser may not decide in the chat of the pressed message (the main chat), or None for a member."""
    assert query.message is not None  # the callers checked that it was pressed in the main chat
    return await ports.members.refusal(query.message.chat.id, query.from_user.id)


def _chat_jid(query: CallbackQuery) -> str | None:
    message = query.message
    return jid_of(message.chat.id) if message is not None else None


# The prefix of a button's callback data -> its handler.
HANDLERS: Final[Mapping[str, CallbackHandler]] = {
    "approve": on_chat_connection,
    "reject": on_chat_connection,
    asking.CALLBACK_PREFIX: on_farm_action,
    stop.CALLBACK_PREFIX: on_stop,
    alert_notify.CALLBACK_PREFIX: on_alert,
}
