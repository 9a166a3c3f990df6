"""Registering and removing groups, with every rule of the contract; used by the CLI and by `register_group`."""

from __future__ import annotations

import os
import re
import sqlite3
from datetime import datetime
from typing import Final

from farmhost.errors import Conflict, InvalidRequest
from farmhost.layout import DataLayout
from farmhost.protocol.codes import folder_problem
from farmhost.store import agent_ids, ledger, outbox, tasks
from farmhost.store import groups as store
from farmhost.store.groups import Group

# A Telegram chat id as Telegram's updates write it: an integer, no leading zeros, no plus sign.
_TELEGRAM_CHAT_RE: Final = re.compile(r"-?[1-9][0-9]{0,19}")

__all__ = ["left_behind", "new_group", "register", "unregister"]


def new_group(
    conn: sqlite3.Connection,
    *,
    jid: str,
    name: str,
    folder: str,
    trigger: str | None,
    requires_trigger: bool,
    is_main: bool,
    at: datetime,
) -> Group:
    """Validate a new registration against the contract and the current registry.

    Raises:
        InvalidRequest: a bad folder, jid or name.
        Conflict: the folder or chat is taken, or a main group already exists.
    """
    problem = folder_problem(folder)
    if problem:
        raise InvalidRequest(problem)
    if ":" not in jid or len(jid) > 256 or any(c.isspace() for c in jid):
        raise InvalidRequest(f"jid {jid!r} is not valid: use channel:id, e.g. telegram:-1001234")
    telegram_problem = _telegram_jid_problem(jid)
    if telegram_problem:
        raise InvalidRequest(telegram_problem)
    if not name.strip():
        raise InvalidRequest("name must not be empty")
    taken = store.find_folder_casefold(conn, folder)
    if taken is not None:
        raise Conflict(f"folder {folder!r} is already used by {taken.jid} ({taken.folder})")
    bound = store.find_by_jid(conn, jid)
    if bound is not None:
        raise Conflict(f"chat {jid} is already registered as folder {bound.folder!r}")
    if is_main:
        current = store.main_group(conn)
        if current is not None:
            raise Conflict(f"a main group already exists ({current.folder!r}); remove it first")
    default_trigger = f"@{name.strip().split()[0]}" if name.strip() else None
    return Group(
        jid=jid,
        name=name.strip(),
        folder=folder,
        trigger=trigger or default_trigger,
        requires_trigger=requires_trigger,
        is_main=is_main,
        added_at=at,
    )


def _telegram_jid_problem(jid: str) -> str | None:
    """Why a `telegram:` jid is not how Telegram's updates name the chat (None when it is, or another channel).

    The outbox sends to the chat the number stands for, so `telegram:0200` would be a second group bound to
    `telegram:200`'s chat (posting there, never hearing it): only the one spelling Telegram uses is accepted.
    """
    channel, _, rest = jid.partition(":")
    if channel != "telegram":
        return None
    if not _TELEGRAM_CHAT_RE.fullmatch(rest):
        digits = rest.removeprefix("-")
        if digits.isascii() and digits.isdigit() and int(digits) != 0:
            return f"jid {jid!r} is not how Telegram writes that chat: use telegram:{int(rest)}"
        return f"jid {jid!r} is not valid: a Telegram chat id is a non-zero integer, e.g. telegram:-1001234"
    return None


def left_behind(conn: sqlite3.Connection, layout: DataLayout, folder: str) -> str | None:
    """What an unregistered `folder` still holds of a group removed earlier, as a phrase; None when it is unused.

    `farmhost group remove` keeps a group's workspace, IPC directory, tasks and host uid, and the operator's
    `group add` of the same folder serves them again. Anyone else registering the folder (a main agent's
    `register_group`, an Approve press in the main chat) would hand another chat that group's memory, files, tasks,
    uid and request results (a request id the old group used is answered from the ledger), so those callers refuse
    or skip such a folder.
    """
    held = []
    if os.path.lexists(layout.workspace(folder)):
        held.append(f"a workspace (groups/{folder}/)")
    if os.path.lexists(layout.group_ipc(folder)):
        held.append(f"an IPC directory (ipc/{folder}/)")
    count = tasks.count_all(conn, folder)
    if count:
        held.append(f"{count} task{'s' if count != 1 else ''}")
    answered = ledger.count_of(conn, folder)
    if answered:
        held.append(f"{answered} answered request{'s' if answered != 1 else ''} (their stored results)")
    if agent_ids.lookup(conn, folder) is not None:
        held.append("a host uid")
    return ", ".join(held) or None


def register(conn: sqlite3.Connection, layout: DataLayout, group: Group, *, reuse: bool = False) -> str | None:
    """Create the group's workspace and IPC queues, then insert it (inside the caller's transaction).

    Directory creation is idempotent, so a crash before the commit leaves nothing that a retry trips on. A folder
    a removed group left (`left_behind`) is given only when the caller `reuse`s it: the operator's `group add`.

    Returns:
        What the folder held of a removed group (None: nothing), for the operator's command to say.

    Raises:
        Conflict: the folder holds a removed group's files, tasks, uid or results, and `reuse` is not given.
    """
    held = left_behind(conn, layout, group.folder)
    if held is not None and not reuse:
        raise Conflict(
            f"folder {group.folder!r} still holds {held} of a group removed earlier; choose another folder "
            "(only the operator can give it back, with `farmhost group add`)"
        )
    layout.create_group(group.folder)
    store.insert_group(conn, group)
    return held


# What a removed group's agent queued and Telegram has not taken yet is not sent to its chat any more.
DROPPED_WITH_GROUP: Final = "its group was removed before it was sent"


def unregister(conn: sqlite3.Connection, folder: str) -> tuple[Group, int]:
    """Remove a registration; the workspace and IPC files are kept, the group's undelivered messages dropped.

    Returns:
        The group removed, and how many of its outbox entries (message chunks, files) will not be sent.

    Raises:
        InvalidRequest: no such group.
    """
    group = store.get_group(conn, folder)
    if group is None:
        raise InvalidRequest(f"no group with folder {folder!r}; see `farmhost group list`")
    store.delete_group(conn, folder)
    return group, outbox.fail_pending_from(conn, folder, error=DROPPED_WITH_GROUP)
