"""Asking for an approval: the row bound to the exact call, and the message with Approve / Deny to the main chat.

The same call (the same action and params, by their hash) from the same group while one is pending gets that
approval back, so an agent that retries does not flood the approvers. Runs inside the caller's transaction.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from farmhost.approvals import store
from farmhost.approvals.store import ApprovalRow
from farmhost.errors import NotAllowed
from farmhost.farm.rules import Approval
from farmhost.store import groups
from farmhost.telegram.notices import enqueue_notice

Choice = Literal["y", "n"]
CALLBACK_PREFIX: Final = "fa"
_ID_BYTES: Final = 6


def call_hash(action: str, params: dict[str, Any]) -> str:
    """The identity of a call: its action and its validated params, canonically serialised."""
    text = json.dumps({"action": action, "params": params}, sort_keys=True, separators=(",", ":"))
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
) -> tuple[ApprovalRow, bool]:
    """The pending approval of this call, created (and sent to the main chat) when there is none.

    Returns:
        (the approval, whether it already existed).

    Raises:
        NotAllowed: no main chat is registered to ask.
    """
    digest = call_hash(action, params)
    existing = store.pending_for(conn, folder, digest)
    if existing is not None and existing.expires_at > at:
        return existing, True
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
    store.create(conn, row)
    keyboard = {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": callback_data(row.id, "y")},
                {"text": "Deny", "callback_data": callback_data(row.id, "n")},
            ]
        ]
    }
    enqueue_notice(conn, key=f"approval:{row.id}", jid=main.jid, text=request_text(row), at=at, reply_markup=keyboard)
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
