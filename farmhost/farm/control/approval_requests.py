"""Asking for an approval: the row bound to the exact call, and the message with Approve / Deny to the main chat.

Requests from the same group that lead to the same effect (the entities and the state asked, whatever the call's
wording: farm/gate.effect_of) while one is pending get that approval back, and a group has at most
FARMHOST_MAX_PENDING_APPROVALS pending at once, so an agent that retries or rephrases cannot flood the approvers
(one message per pending approval). That message shows the whole call in one Telegram message: a call too long
for it is refused (invalid_request), never cut or split. Runs inside the caller's transaction.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from farmhost.errors import InvalidRequest, NotAllowed, RateLimited
from farmhost.farm.control.rules import Approval
from farmhost.outbox.notices import enqueue_notice
from farmhost.outbox.stop_messages import stop_keyboard
from farmhost.store import approvals as store
from farmhost.store import groups
from farmhost.store.approvals import ApprovalRow

Choice = Literal["y", "n"]
CALLBACK_PREFIX: Final = "fa"
_ID_BYTES: Final = 6
# The approvers' message is one Telegram message (4096 at most) with room for the outcome appended to it: a call
# longer than that to show is not asked, rather than split into chunks nobody reads as one, or cut.
MAX_TEXT: Final = 3000


def effect_hash(effect: dict[str, Any]) -> str:
    """The identity of what a call leads to, canonically serialised (key order does not count)."""
    text = json.dumps(effect, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def callback_data(approval_id: str, choice: Choice) -> str:
    """`fa:<id>:y|n`: well inside Telegram's 64 bytes."""
    return f"{CALLBACK_PREFIX}:{approval_id}:{choice}"


def parse_callback(data: str | None) -> tuple[str, Choice] | None:
    """`(approval id, choice)` of an approval button's data; None for anything else."""
    parts = (data or "").split(":")
    if len(parts) != 3 or parts[0] != CALLBACK_PREFIX or parts[2] not in ("y", "n"):
        return None
    approval_id = parts[1]
    if not (approval_id.startswith("a-") and len(approval_id) == 2 + 2 * _ID_BYTES):
        return None
    if any(c not in "0123456789abcdef" for c in approval_id[2:]):
        return None
    choice: Choice = "y" if parts[2] == "y" else "n"
    return approval_id, choice


def ask(
    conn: sqlite3.Connection,
    *,
    folder: str,
    request_id: str,
    action: str,
    params: dict[str, Any],
    summary: str,
    approval: Approval,
    at: datetime,
    effect: dict[str, Any] | None = None,
    max_pending: int | None = None,
) -> tuple[ApprovalRow, bool]:
    """The pending approval of this effect, created (and sent to the main chat) when there is none.

    Args:
        conn: the caller's transaction.
        folder: the asking group.
        request_id: the request that asks.
        action: the farm action to run once approved.
        params: its validated params (what runs, as the first asker wrote them).
        summary: what will happen, in words.
        approval: who may approve, and how long the request waits.
        at: now.
        effect: what the call leads to (requests with the same effect share one approval); by default the action
            and its params.
        max_pending: the most approvals the group may have pending at once (None: no bound).

    Returns:
        (the approval, whether it already existed).

    Raises:
        NotAllowed: no main chat is registered to ask.
        RateLimited: the group already has `max_pending` approvals waiting; nobody is asked.
        InvalidRequest: the approvers' message would be longer than MAX_TEXT; nobody is asked.
    """
    digest = effect_hash(effect if effect is not None else {"action": action, "params": params})
    existing = store.pending_for(conn, folder, digest)
    if existing is not None and existing.expires_at > at:
        return existing, True
    if max_pending is not None:
        waiting = store.pending_of_group(conn, folder, at)
        if len(waiting) >= max_pending:
            ids = ", ".join(row.id for row in waiting)
            raise RateLimited(
                f"{action} would need an approval, and the group {folder} already has {len(waiting)} approvals "
                f"waiting in the farm's main chat ({ids}), the most it may have at once "
                f"(FARMHOST_MAX_PENDING_APPROVALS={max_pending}). Nothing was done and nobody was asked: wait "
                "until those are answered or expire"
            )
    main = groups.main_group(conn)
    if main is None:
        raise NotAllowed(
            f"{action} needs an approval in the main chat (farm profile rules), and no main chat is registered"
        )
    if existing is not None:  # past its time but not swept yet: it expires now (the desk tells it), a new one is asked
        store.lapse(conn, existing.id)
    row = ApprovalRow(
        id="a-" + secrets.token_hex(_ID_BYTES),
        group_folder=folder,
        request_id=request_id,
        action=action,
        params=params,
        call_hash=digest,
        summary=summary,
        approvers=approval.approvers,
        status="pending",
        created_at=at,
        expires_at=at + timedelta(minutes=approval.expires_minutes),
    )
    text = request_text(row)
    if len(text) > MAX_TEXT:
        raise InvalidRequest(
            f"{action} needs an approval, and the call is too long to show the approvers in one message "
            f"({len(text)} characters, at most {MAX_TEXT}): leave out the data the service does not need. Nothing "
            "was done and nobody was asked"
        )
    store.create(conn, row)
    keyboard = {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": callback_data(row.id, "y")},
                {"text": "Deny", "callback_data": callback_data(row.id, "n")},
            ],
            *stop_keyboard()["inline_keyboard"],  # every safety message carries the emergency stop
        ]
    }
    enqueue_notice(conn, key=f"approval:{row.id}", jid=main.jid, text=text, at=at, reply_markup=keyboard)
    return row, False


def request_text(row: ApprovalRow) -> str:
    """The approvers' message: exactly what will happen, who asked, until when, and who may decide."""
    who = (
        "any member of this chat"
        if row.approvers is None
        else "Telegram user " + ", ".join(str(user) for user in sorted(row.approvers))
    )
    return (
        f"Approval needed ({row.id}): the group {row.group_folder} asks to {row.summary}.\n"
        f"Action {row.action}, params {json.dumps(row.params, sort_keys=True)}; request {row.request_id}.\n"
        f"It expires at {row.expires_at:%Y-%m-%d %H:%M} UTC; {who} may approve or deny it. "
        "Nothing happens unless it is approved."
    )
