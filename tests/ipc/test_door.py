"""The router's door (`Router.run_as`) on a real database: one id runs once, however often the host asks.

The end-to-end tests (tests/integration/test_one_door_end_to_end.py) show the traces through the daemon; here the
moment two askers overlap can be held open: the handler waits until both have asked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process

from farmhost.handling import Approved, Effect, HandlerSpec, RequestContext
from farmhost.ipc.router import Router
from farmhost.layout import DataLayout
from farmhost.ndjson_log import NdjsonLog
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, FarmActionRequest
from farmhost.store import groups, ledger
from farmhost.store.db import Database

TOGGLE = FarmActionRequest(
    type="farm_action",
    action="ha_call_service",
    params={"domain": "switch", "service": "toggle", "target": {"entity_id": "switch.irrigation_pump"}},
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


@pytest.fixture
def db(root: Path) -> Iterator[Database]:
    database = Database.open(root)
    yield database
    database.close()


class Toggle:
    """A handler that counts its runs and, once `gate` is set, waits for it (two askers overlap meanwhile)."""

    def __init__(self) -> None:
        self.runs: list[Approved | None] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, ctx: RequestContext, request: AnyRequest) -> Outcome:
        self.runs.append(ctx.approved)
        if self.gate is not None:
            await self.gate.wait()
        return Outcome(result={"toggled": len(self.runs)})


def router(root: Path, db: Database, run: Toggle, log: NdjsonLog) -> Router:
    layout = DataLayout(root)
    handlers = {"farm_action:ha_call_service": HandlerSpec(effect=Effect.EXTERNAL, run=run)}
    return Router(handlers=handlers, site="farm", layout=layout, db=db, on_change=lambda changes: None, request_log=log)


def logged(root: Path) -> list[dict[str, Any]]:
    path = DataLayout(root).logs / "requests.ndjson"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_same_id_asked_twice_at_once_and_once_more_later_runs_once(root: Path, db: Database) -> None:
    toggle = Toggle()
    toggle.gate = asyncio.Event()
    log = NdjsonLog(DataLayout(root).logs, max_bytes=1 << 20)
    door = router(root, db, toggle, log)
    field = groups.get_group(db.conn, "field")
    assert field is not None
    approved = Approved(approval_id="a-1", by="@ana", asked_in="r-1")

    def ask() -> asyncio.Task[Any]:
        return asyncio.create_task(
            door.run_as(field, TOGGLE, request_id="approval:a-1", via="approval", approved=approved)
        )

    first, second = ask(), ask()
    while not toggle.runs:  # the first is in the handler; the second waits on it
        await asyncio.sleep(0)
    toggle.gate.set()
    answers = await asyncio.gather(first, second)
    later = await door.run_as(field, TOGGLE, request_id="approval:a-1", via="approval", approved=approved)
    log.close()

    assert toggle.runs == [approved]  # the approval reached the handler, once
    assert [a.replayed for a in answers] == [False, True] and later.replayed
    assert {a.document["result"]["toggled"] for a in [*answers, later]} == {1}
    entry = ledger.get_entry(db.conn, "field", "approval:a-1")
    assert entry is not None and entry.state == "done"
    assert [(line["group"], line["via"], line["requestId"], line["replayed"]) for line in logged(root)] == [
        ("field", "approval", "approval:a-1", False),
        ("field", "approval", "approval:a-1", True),
        ("field", "approval", "approval:a-1", True),
    ]


async def test_a_request_id_is_kept_per_group(root: Path, db: Database) -> None:
    toggle = Toggle()
    log = NdjsonLog(DataLayout(root).logs, max_bytes=1 << 20)
    door = router(root, db, toggle, log)
    for folder in ("main", "field"):
        group = groups.get_group(db.conn, folder)
        assert group is not None
        answer = await door.run_as(group, TOGGLE, request_id="assist:run-1", via="assist")
        assert not answer.replayed and answer.document["status"] == "success"
    log.close()
    assert toggle.runs == [None, None]  # each group's own id, each run once, none under an approval
