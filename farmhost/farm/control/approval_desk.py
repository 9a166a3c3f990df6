"""The approval desk: Approve / Deny presses, expiry on time, the restart check, and what each one tells.

A press is checked against the approval (it must be pending and not past its time), the chat (the main chat
only) and the presser (the rule's approvers, else the main chat's members: the chat side finds out who they are
and hands over its refusal, `Presser.not_member`). Approve runs the exact stored call once, as the asking group,
through the router's door like any request (the ledger under `approval:<id>`, one request log line, the farm
action's own checks), with the approver in its audit line; Deny, expiry and a refused press
run nothing and are audited. Every outcome is posted to the asking group's chat and kept for its agent's next
run (`store.take_unreported`). An approval that was approved but whose run never finished (the host stopped or
crashed during it) is failed at start, never run a second time.

Expiry is timed, not polled: the desk sleeps until the earliest pending approval's time (read from the index on
status and expiry) and looks again after each look. It is told (`approvals_changed`) when an approval may have been
asked or lapsed: after a request that changed the outbox (asking posts the approvers' message) and after another
process committed. It also looks at least every SAFETY_SECONDS, for an approval asked where nothing tells it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from farmhost.farm.audit import AuditLog
from farmhost.farm.control.approval_requests import Choice
from farmhost.handling import Approved
from farmhost.outbox.notices import enqueue_notice
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.requests import FarmActionRequest
from farmhost.store import approvals as store
from farmhost.store import groups
from farmhost.store.approvals import ApprovalRow
from farmhost.store.db import Database, now_utc

if TYPE_CHECKING:
    from farmhost.ipc.router import Router

logger = logging.getLogger(__name__)

# The desk looks for approvals past their time at least this often, whatever it was told.
SAFETY_SECONDS: Final = 60.0
# A look is timed this much after the expiry, so that the wall clock, not only the loop's, is past it.
_LATE_S: Final = 0.05

# What an approval's outcome says when the host itself broke while running the call (a bug, in the host log).
BROKE: Final = "farmhost failed while running it (see the host log)"


@dataclass(frozen=True)
class Press:
    """What a press answers at once (`answer`, the toast), and the run it started (awaited after the answer)."""

    answer: str
    note: str | None = None  # appended to the approval message in the main chat
    run: Coroutine[Any, Any, str] | None = None  # Approve's run; its result is the note


@dataclass(frozen=True, kw_only=True)
class Presser:
    """Who pressed, and where."""

    user_id: int
    who: str  # @username or full name, as transcripts name them
    in_main_chat: bool
    not_member: str | None  # why the presser is not taken for a member of the main chat (None: a member)


class ApprovalDesk:
    """Decides approvals from the chat and keeps their outcomes; one per daemon."""

    def __init__(
        self,
        *,
        db: Database,
        audit: AuditLog,
        door: Router,
        wake_outbox: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = now_utc,
        safety_seconds: float = SAFETY_SECONDS,
    ) -> None:
        self._db = db
        self._audit = audit
        self._door = door
        self._wake = wake_outbox
        self._clock = clock
        self._safety_seconds = safety_seconds
        self._look: asyncio.TimerHandle | None = None  # the next look for approvals past their time

    async def start(self) -> None:
        """Fail the approved runs a stop interrupted, expire what is past its time, time the next look."""
        with self._db.tx() as conn:
            for row in store.approved_unfinished(conn):
                outcome = (
                    f"farmhost stopped while running it (approved by {row.decided_by}); it is not run again, "
                    "so check the device and ask again if it is still needed"
                )
                store.finish(conn, row.id, status="failed", outcome=outcome)
                self._tell(conn, row, f"Approval {row.id} ({row.summary}): {outcome}.")
                logger.warning("approval %s: interrupted by a stop; failed, not run again", row.id)
        self._look_now()

    async def stop(self) -> None:
        """Stop looking for expiries."""
        if self._look is not None:
            self._look.cancel()
            self._look = None

    def approvals_changed(self) -> None:
        """An approval may have been asked or lapsed: look when the earliest one is due, if that is sooner."""
        if self._look is not None:
            self._plan()

    def _look_now(self) -> None:
        self._look = None
        try:
            self._expire()
        except Exception:  # a failing look must not end expiry for the life of the daemon
            logger.exception("approvals: the look for expired approvals failed; trying again")
        finally:
            self._plan()

    def _plan(self) -> None:
        """(Re)time the next look: at the earliest due approval, at the latest SAFETY_SECONDS from now."""
        delay = self._safety_seconds
        try:
            due = store.next_due(self._db.conn)
        except sqlite3.Error:
            logger.exception("approvals: cannot read when the next approval expires; looking in %g s", delay)
            due = None
        if due is not None:
            delay = min(delay, max(0.0, (due - self._clock()).total_seconds() + _LATE_S))
        loop = asyncio.get_running_loop()
        at = loop.time() + delay
        if self._look is not None:
            if self._look.when() <= at:
                return  # it already looks as early
            self._look.cancel()
        self._look = loop.call_at(at, self._look_now)

    def notes(self, folder: str) -> list[str]:
        """The outcomes of the group's approvals its agent has not been told yet (each told once), as sentences."""
        with self._db.tx() as conn:
            rows = store.take_unreported(conn, folder)
        return [
            f"your {row.action} request {row.request_id} (approval {row.id}: {row.summary}) was {row.status}: "
            f"{row.outcome or row.status}"
            for row in rows
        ]

    def press(self, approval_id: str, choice: Choice, presser: Presser) -> Press:
        """Decide one press; Approve's run is handed back in `Press.run` so the press is answered first."""
        now = self._clock()
        with self._db.tx() as conn:
            row = store.get(conn, approval_id)
            if row is None:
                return Press("This approval is not known here.")
            refusal = _refusal(row, presser)
            if refusal is not None:
                self._audit_decision(row, "refused press", presser.who, now, f"{presser.who}: {refusal}")
                logger.warning("approval %s: press by %s refused: %s", row.id, presser.who, refusal)
                return Press(refusal)
            if row.status != "pending":
                return Press(f"This approval was already {_said(row)}; nothing more is done.")
            if row.expires_at <= now:
                self._expire_in(conn, now)
                return Press("This approval has expired; nothing was done.", note="Expired: nothing was done.")
            status: store.Status = "approved" if choice == "y" else "denied"
            outcome = f"denied by {presser.who}; nothing was done" if status == "denied" else None
            if not store.decide(conn, row.id, status=status, by=presser.who, at=now, outcome=outcome):
                return Press("This approval was decided a moment ago; nothing more is done.")
            if outcome is not None:
                self._tell(conn, row, f"Approval {row.id} ({row.summary}): {outcome}.")
        if outcome is not None:
            self._audit_decision(row, "denied", presser.who, now, outcome)
            logger.info("approval %s: denied by %s", row.id, presser.who)
            return Press("Denied: nothing is done.", note=f"Denied by {presser.who}: nothing was done.")
        logger.info("approval %s: approved by %s; running %s", row.id, presser.who, row.action)
        return Press("Approved: running it now.", run=self._run(row, presser.who, presser.user_id))

    async def _run(self, row: ApprovalRow, by: str, user_id: int) -> str:
        """Run the approved call once and record how it went; returns the note for the approval message."""
        try:
            failure = await self._execute(row, by, user_id)
        except Exception:  # a bug must not leave the approval running forever, nor the group untold
            logger.exception("approval %s: running %s failed", row.id, row.action)
            failure = BROKE
        status: store.Status = "done" if failure is None else "failed"
        outcome = f"approved by {by} and done" if failure is None else f"approved by {by}, but {failure}"
        with self._db.tx() as conn:
            if store.finish(conn, row.id, status=status, outcome=outcome):
                self._tell(conn, row, f"Approval {row.id} ({row.summary}): {outcome}.")
        logger.info("approval %s: %s", row.id, outcome)
        return f"{outcome[0].upper()}{outcome[1:]}."

    async def _execute(self, row: ApprovalRow, by: str, user_id: int) -> str | None:
        """Run the stored call as the asking group through the router's door; None when done, else why not.

        The farm action checks it again (the profile may have changed since it was asked: the approver must be
        among the approvers its rules name now), counts it against the rates and writes the audit line with the
        approver; the ledger, keyed by the approval, runs it once.
        """
        with self._db.tx() as conn:
            group = groups.get_group(conn, row.group_folder)
        if group is None:
            return f"it failed: the group {row.group_folder} is not registered any more"
        request = FarmActionRequest.model_validate({"type": "farm_action", "action": row.action, "params": row.params})
        approved = Approved(approval_id=row.id, by=by, asked_in=row.request_id, user_id=user_id)
        answer = await self._door.run_as(
            group, request, request_id=f"approval:{row.id}", via="approval", approved=approved
        )
        document = answer.document
        if document["status"] == "success":
            return None
        if document["errorCode"] == ErrorCode.INTERNAL:
            return BROKE
        return f"it failed: {document['error']}"

    def _expire(self) -> None:
        now = self._clock()
        with self._db.tx() as conn:
            self._expire_in(conn, now)

    def _expire_in(self, conn: sqlite3.Connection, now: datetime) -> None:
        for row in store.expire_due(conn, now):
            self._tell(conn, row, f"Approval {row.id} ({row.summary}) expired: nobody approved it in time, nothing "
                       "was done.")  # fmt: skip
            self._audit_decision(row, "expired", None, now, "nobody approved it in time")
            logger.info("approval %s: expired", row.id)

    def _tell(self, conn: sqlite3.Connection, row: ApprovalRow, text: str) -> None:
        """Post the outcome to the asking group's chat (once: the key is the approval's)."""
        group = groups.get_group(conn, row.group_folder)
        if group is None:
            return
        try:
            enqueue_notice(conn, key=f"approval-outcome:{row.id}", jid=group.jid, text=text, at=self._clock())
        except sqlite3.IntegrityError:
            return
        asyncio.get_running_loop().call_soon(self._wake)

    def _audit_decision(self, row: ApprovalRow, decision: str, by: str | None, at: datetime, detail: str) -> None:
        self._audit.record(
            at=at,
            group=row.group_folder,
            request_id=row.request_id,
            action=row.action,
            params=row.params,
            error_code=ErrorCode.NOT_ALLOWED,
            duration_ms=0,
            extra={"approvalId": row.id, "decision": decision, "decidedBy": by, "detail": detail},
        )


def _refusal(row: ApprovalRow, presser: Presser) -> str | None:
    """Why this presser may not decide this approval, or None."""
    if not presser.in_main_chat:
        return "Only the farm's main chat can decide approvals."
    if row.approvers is not None:
        if presser.user_id not in row.approvers:
            return "You are not one of this approval's approvers."
    elif presser.not_member is not None:
        return presser.not_member
    return None


def _said(row: ApprovalRow) -> str:
    if row.status in ("done", "failed", "approved"):
        return f"approved by {row.decided_by}"
    if row.status == "denied":
        return f"denied by {row.decided_by}"
    return "expired"
