"""Connecting new chats: offered to the main chat, approved (registered as a group) or rejected by its operator.

An unregistered chat that addresses the bot is offered once while pending; Approve registers it with a folder
made from its title, Reject records the refusal. Anyone can write to a bot or add it to a group, so at most
MAX_WAITING offers asked within WAITING_WINDOW wait at once: past that a request is not offered, nor recorded
(the chat may ask again once the operator decided one), and the asking chat gets no answer.

Everything here runs inside the caller's transaction; messages go through the outbox.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, Literal

from farmhost.groups.registry import left_behind, new_group, register
from farmhost.layout import DataLayout
from farmhost.outbox.notices import enqueue_notice
from farmhost.protocol.codes import folder_problem
from farmhost.store import groups, telegram_state
from farmhost.store.groups import Group

Choice = Literal["approve", "reject"]

# Callback data is at most 64 bytes; `approve:telegram:-1001234567890` is 31.
CALLBACK_MAX_BYTES: Final = 64
_CALLBACK_RE: Final = re.compile(r"^(approve|reject):(telegram:-?[0-9]{1,20})$")
_FOLDER_STEM: Final = 56  # room for a "-NNN" suffix within the 64 characters of a folder
# A flood of strangers (accounts writing to the bot, groups adding it) asks the operator this much at most.
MAX_WAITING: Final = 5
# An offer left undecided longer than this no longer holds a place.
WAITING_WINDOW: Final = timedelta(days=1)


@dataclass(frozen=True)
class Decision:
    """What the operator's button did: the callback answer, the note for the approval message, the new group."""

    answer: str
    note: str | None = None
    group: Group | None = None


def callback_data(choice: Choice, jid: str) -> str:
    """The data of an Approve / Reject button."""
    data = f"{choice}:{jid}"
    if len(data.encode()) > CALLBACK_MAX_BYTES:
        raise ValueError(f"callback data for {jid} is over {CALLBACK_MAX_BYTES} bytes")
    return data


def parse_callback(data: str | None) -> tuple[Choice, str] | None:
    """`(choice, jid)` of an approval button's data; None for anything else."""
    match = _CALLBACK_RE.fullmatch(data or "")
    if match is None:
        return None
    choice: Choice = "approve" if match.group(1) == "approve" else "reject"
    return choice, match.group(2)


def is_private(jid: str) -> bool:
    """Whether a Telegram jid is a one-to-one chat (users have positive ids, groups and channels negative)."""
    return not jid.split(":", 1)[1].startswith("-")


def folder_for(title: str, taken: Callable[[str], bool]) -> str:
    """A valid, free folder name for a chat title: ASCII slug, lower case, `-2`, `-3`... when taken or reserved."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    stem = re.sub(r"[^A-Za-z0-9]+", "-", ascii_title).strip("-").lower()[:_FOLDER_STEM].strip("-") or "chat"
    candidate, number = stem, 1
    while folder_problem(candidate) is not None or taken(candidate):
        number += 1
        candidate = f"{stem}-{number}"
    return candidate


def offer(
    conn: sqlite3.Connection,
    *,
    jid: str,
    title: str,
    requested_by: str,
    key: str,
    at: datetime,
) -> str:
    """Ask the main chat to approve `jid` (once while it is pending); returns what happened, for the update log."""
    pending = telegram_state.get_pending(conn, jid)
    if pending is not None and pending.status == "pending":
        return "already waiting for approval"
    if pending is not None and pending.status == "rejected":
        return "rejected earlier; register it with `farmhost group add` to connect it"
    waiting = telegram_state.count_waiting(conn, since=at - WAITING_WINDOW)
    if waiting >= MAX_WAITING:
        return (
            f"not offered: {waiting} chats already wait for the operator's approval (at most {MAX_WAITING}); "
            "it can ask again once one is decided"
        )
    main = groups.main_group(conn)
    telegram_state.add_pending(conn, jid=jid, title=title, requested_by=requested_by, at=at)
    if main is None:
        return "no main chat is registered to approve it (see `farmhost group add --main`)"
    kind = "private chat" if is_private(jid) else "group"
    text = (
        f'The {kind} "{title}" ({jid}) asks to talk to the farm bot; {requested_by} wrote to me there.\n'
        "Approve to connect it as a new group with its own workspace, or reject it."
    )
    keyboard = {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": callback_data("approve", jid)},
                {"text": "Reject", "callback_data": callback_data("reject", jid)},
            ]
        ]
    }
    enqueue_notice(conn, key=f"approval:{key}", jid=main.jid, text=text, at=at, reply_markup=keyboard)
    enqueue_notice(
        conn,
        key=f"approval-asked:{key}",
        jid=jid,
        text="Hello! I'm not connected to this chat yet. I've asked the farm's operator to approve it "
        "and will say here when it's done.",
        at=at,
    )
    return f"offered to the main chat ({main.jid})"


def decide(
    conn: sqlite3.Connection,
    layout: DataLayout,
    *,
    choice: Choice,
    jid: str,
    decided_by: str,
    bot_username: str,
    key: str,
    at: datetime,
) -> Decision:
    """Apply the operator's Approve / Reject to a pending chat.

    Raises:
        FarmhostError: the registration was refused (InvalidRequest, Conflict).
        OSError: the group's directories could not be created.
    """
    pending = telegram_state.get_pending(conn, jid)
    if pending is None:
        return Decision(f"There is no request from {jid} (any more).")
    if pending.status != "pending":
        where = f" as folder {pending.folder}" if pending.folder else ""
        return Decision(f"This request was already {pending.status}{where}.")
    title = pending.title or jid
    if choice == "reject":
        telegram_state.decide_pending(conn, jid, status="rejected", folder=None, by=decided_by, at=at)
        return Decision(f'Rejected "{title}".', note=f"Rejected by {decided_by}.")
    existing = groups.find_by_jid(conn, jid)
    if existing is not None:
        telegram_state.decide_pending(conn, jid, status="approved", folder=existing.folder, by=decided_by, at=at)
        return Decision(
            f"{jid} is already registered as folder {existing.folder}.",
            note=f"Already registered as folder {existing.folder}.",
        )
    # A removed group's folder keeps its files and tasks: a new chat gets a folder of its own, never those.
    folder = folder_for(
        title,
        lambda name: groups.find_folder_casefold(conn, name) is not None or left_behind(conn, layout, name) is not None,
    )
    private = is_private(jid)
    group = new_group(
        conn,
        jid=jid,
        name=title,
        folder=folder,
        trigger=f"@{bot_username}",
        requires_trigger=not private,
        is_main=False,
        at=at,
    )
    register(conn, layout, group)
    telegram_state.decide_pending(conn, jid, status="approved", folder=folder, by=decided_by, at=at)
    enqueue_notice(conn, key=f"connected:{key}", jid=jid, text=connected_text(group), at=at)
    return Decision(
        f'Connected "{title}" as folder {folder}.',
        note=f"Approved by {decided_by}: connected as folder {folder}.",
        group=group,
    )


def connected_text(group: Group) -> str:
    """What a newly connected chat is told."""
    if not group.requires_trigger:
        return "This chat is now connected to the farm. Just write to me here; /help shows what I can do."
    trigger = group.trigger or "my name"
    return (
        f"This chat is now connected to the farm. Address me with {trigger}, for example "
        f'"{trigger} how full is the water tank?". Other messages here are kept as context for my next answer. '
        "/help shows more."
    )
