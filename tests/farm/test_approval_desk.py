"""The approval desk on a real database, where the end-to-end tests cannot time things.

A press in the moment between an approval's expiry and the desk's look, a re-ask of a call whose approval just
expired, a run that breaks, an approval that expires when its time comes (the desk sleeps until then).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import FIELD_JID, init_data_dir_in_process, scaled

from farmhost.farm.audit import AuditLog
from farmhost.farm.control import approval_requests as asking
from farmhost.farm.control.approval_desk import ApprovalDesk, Presser
from farmhost.farm.control.rules import Approval
from farmhost.handling import Approved, Effect, HandlerSpec, RequestContext
from farmhost.ipc.router import Router
from farmhost.layout import DataLayout
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest
from farmhost.store import approvals as store
from farmhost.store import outbox
from farmhost.store.approvals import ApprovalRow
from farmhost.store.db import Database, now_utc

ANA = Presser(user_id=42, who="@ana", in_main_chat=True, not_member=None)
PARAMS = {"entityId": "switch.irrigation_pump", "value": "on"}


class Clock:
    def __init__(self) -> None:
        self.now = now_utc()

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


@pytest.fixture
def db(root: Path) -> Iterator[Database]:
    database = Database.open(root)
    yield database
    database.close()


def audit_lines(root: Path) -> list[dict[str, Any]]:
    path = DataLayout(root).farm_state / "audit.ndjson"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def told(db: Database) -> list[str]:
    return [e.body or "" for e in outbox.list_entries(db.conn) if e.chat_jid == FIELD_JID]


def ask(db: Database, at: datetime, minutes: float = 0.05, request_id: str = "r-1") -> tuple[ApprovalRow, bool]:
    with db.tx() as conn:
        return asking.ask(
            conn,
            folder="field",
            request_id=request_id,
            action="ha_set_entity",
            params=PARAMS,
            summary="set switch.irrigation_pump to on",
            approval=Approval(approvers=None, expires_minutes=minutes),
            at=at,
        )


def desk(
    db: Database, root: Path, clock: Callable[[], datetime], ran: list[Approved] | None = None, **options: float
) -> ApprovalDesk:
    """The desk on a real router whose ha_set_entity row records what it ran (or breaks, without `ran`)."""

    async def run(ctx: RequestContext, request: AnyRequest) -> Outcome:
        if ran is None:
            raise RuntimeError("a bug in the handler")
        assert ctx.approved is not None
        ran.append(ctx.approved)
        return Outcome(result={})

    layout = DataLayout(root)
    handlers = {"farm_action:ha_set_entity": HandlerSpec(effect=Effect.EXTERNAL, run=run)}
    router = Router(handlers=handlers, site="farm", layout=layout, db=db, on_change=lambda changes: None)
    audit = AuditLog(layout.farm_state, max_bytes=1 << 20)
    return ApprovalDesk(db=db, audit=audit, door=router, clock=clock, **options)


async def test_a_press_after_the_expiry_but_before_the_sweep_runs_nothing_and_tells_the_group(
    db: Database, root: Path
) -> None:
    clock = Clock()
    row, _ = ask(db, clock.now)
    clock.now += timedelta(seconds=4)
    ran: list[Approved] = []
    press = desk(db, root, clock, ran).press(row.id, "y", ANA)
    assert press.run is None and press.answer == "This approval has expired; nothing was done."
    assert not ran
    assert store.get(db.conn, row.id).status == "expired"  # type: ignore[union-attr]
    assert [t for t in told(db) if row.id in t and "expired" in t]
    assert [a["decision"] for a in audit_lines(root)] == ["expired"]


async def test_asking_again_after_an_unswept_expiry_still_tells_and_audits_the_expired_one(
    db: Database, root: Path
) -> None:
    clock = Clock()
    first, _ = ask(db, clock.now)
    clock.now += timedelta(seconds=4)  # past its time; the sweep has not come by yet
    second, again = ask(db, clock.now, request_id="r-2")
    assert not again and second.id != first.id
    assert store.get(db.conn, first.id).status == "expired"  # type: ignore[union-attr]
    sweeping = desk(db, root, clock)
    await sweeping.start()  # its first sweep tells what expired, whoever marked it
    await sweeping.stop()
    assert [t for t in told(db) if first.id in t and "expired" in t]
    assert [(a["approvalId"], a["decision"]) for a in audit_lines(root)] == [(first.id, "expired")]


async def test_an_approved_run_that_breaks_is_failed_and_told_not_left_running(db: Database, root: Path) -> None:
    clock = Clock()
    row, _ = ask(db, clock.now, minutes=10)
    press = desk(db, root, clock).press(row.id, "y", ANA)
    assert press.run is not None
    note = await press.run
    finished = store.get(db.conn, row.id)
    assert finished is not None and finished.status == "failed"
    assert note == "Approved by @ana, but farmhost failed while running it (see the host log)."
    assert [t for t in told(db) if row.id in t and "failed while running it" in t]


async def _expired(db: Database, approval_id: str) -> None:
    while (row := store.get(db.conn, approval_id)) is None or row.outcome is None:
        await asyncio.sleep(0.05)


async def test_an_approval_asked_while_the_desk_waits_expires_when_its_time_comes(db: Database, root: Path) -> None:
    waiting = desk(db, root, now_utc)
    await waiting.start()  # nothing pending: the desk sleeps (for its safety look, a minute away)
    try:
        row, _ = ask(db, now_utc(), minutes=0.5 / 60)
        waiting.approvals_changed()  # what the daemon does after a request that changed the outbox
        await asyncio.wait_for(_expired(db, row.id), timeout=scaled(10))
    finally:
        await waiting.stop()
    assert store.get(db.conn, row.id).status == "expired"  # type: ignore[union-attr]
    assert [t for t in told(db) if row.id in t and "expired" in t]
    assert [a["decision"] for a in audit_lines(root)] == ["expired"]


async def test_an_approval_nobody_told_the_desk_of_expires_at_its_safety_look(db: Database, root: Path) -> None:
    waiting = desk(db, root, now_utc, safety_seconds=0.5)
    await waiting.start()
    try:
        row, _ = ask(db, now_utc(), minutes=0.2 / 60)  # asked where nothing tells the desk
        await asyncio.wait_for(_expired(db, row.id), timeout=scaled(10))
    finally:
        await waiting.stop()
    assert store.get(db.conn, row.id).status == "expired"  # type: ignore[union-attr]
    assert [a["decision"] for a in audit_lines(root)] == ["expired"]
