"""What a request handler is: its effect class, its policy, and the context it runs in."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from farmhost.protocol.envelope import Outcome

if TYPE_CHECKING:
    from farmhost.layout import DataLayout
    from farmhost.protocol.codes import ErrorCode
    from farmhost.protocol.requests import AnyRequest
    from farmhost.store.db import Database
    from farmhost.store.groups import Group

# 30 s: longer than any single HA call (10 s) and shorter than the agent client's wait (40 s), so the
# host always answers with an explicit `timeout` before the agent gives up.
DEFAULT_HANDLER_TIMEOUT: Final = 30.0


class Effect(StrEnum):
    """How a request changes the world; it decides what happens after a crash."""

    READ = "read"  # no change: re-run after a crash
    STATE = "state"  # changes farmhost's own database only: committed atomically with the ledger entry
    EXTERNAL = "external"  # changes HA or files: never re-run after a crash, answered `interrupted`
    # runs at another site, which executes each call once by its id: re-run after a crash, it asks for the same
    # answer again instead of running anything twice
    REMOTE = "remote"


class Change(StrEnum):
    """What a STATE handler changed, so the host rewrites the right snapshots."""

    TASKS = "tasks"
    GROUPS = "groups"
    OUTBOX = "outbox"


@dataclass(frozen=True)
class Approved:
    """The approval in the chat a control action runs under: its id, who pressed Approve, the request that asked."""

    approval_id: str
    by: str
    asked_in: str  # the requestId that asked for it: its audit lines, asked, decided and run, all carry this id
    user_id: int | None = None  # the approver's Telegram user id, held against the approvers the rules name now


@dataclass(frozen=True, kw_only=True)
class RequestContext:
    """Everything a handler may use: the source group (from the directory), paths, store, clock.

    No settings: a capability binds its own section into its handler rows when the app builds the table.
    """

    group: Group
    layout: DataLayout
    db: Database
    now: datetime
    request_id: str
    changes: set[Change] = field(default_factory=set)
    prepared: object = None  # what the handler's `prepare` step returned, for its `apply`
    approved: Approved | None = None  # a control action run because an approver approved it in the chat


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """A request of a handler's row answered without running the handler: expired, or not a valid request."""

    group: str
    request_id: str | None  # None: no id could be recovered from the file
    params: Any  # the request's params as written (not validated)
    code: ErrorCode
    at: datetime  # when the host received it
    duration_ms: int
    request: AnyRequest | None = None  # as decoded (None: refused as not valid), for a row serving many actions
    action: str | None = None  # the `action` written, when it is text (a row serving many actions names it)


AsyncHandler = Callable[[RequestContext, "AnyRequest"], Awaitable[Outcome]]
# What a row does with a refusal the router answered for it (the farm actions audit it, as every other refusal).
RefusalHandler = Callable[[Refusal], None]
# A STATE handler is synchronous on purpose: it runs inside the ledger's transaction and must not yield
# to the event loop, or another group's writes would land in the same transaction.
StateHandler = Callable[[RequestContext, "AnyRequest", sqlite3.Connection], Outcome]
# Work a STATE handler needs before its transaction (file copies, anything slow): awaited first, off the
# transaction, so it may run in a thread; it raises FarmhostError to refuse. Its result reaches `apply` as
# `ctx.prepared`.
Preparer = Callable[[RequestContext, "AnyRequest"], Awaitable[object]]


@dataclass(frozen=True, kw_only=True)
class HandlerSpec:
    """One row of the handler table."""

    effect: Effect
    run: AsyncHandler | None = None
    apply: StateHandler | None = None
    prepare: Preparer | None = None
    main_only: bool = False
    timeout: float = DEFAULT_HANDLER_TIMEOUT
    on_refused: RefusalHandler | None = None  # told of each request of this row refused before its handler ran

    def __post_init__(self) -> None:
        if (self.effect is Effect.STATE) != (self.apply is not None) or (self.run is None) == (self.apply is None):
            raise ValueError("a STATE handler has `apply`; READ/EXTERNAL handlers have `run`")
        if self.prepare is not None and self.apply is None:
            raise ValueError("only a STATE handler has a `prepare` step")


# The row of every farm action that names another site (`site`): it is sent there, whatever the action.
SITE_HANDLER: Final = "farm_action@site"
# The action of the row told of a request of its type whose action no row serves (refused as not valid, so never
# routed): a farm action of a name this host does not know is audited all the same.
ANY_ACTION: Final = "*"


def handler_key(kind: str, action: str | None) -> str:
    """The table key: `type`, or `type:action` for requests with actions."""
    return f"{kind}:{action}" if action else kind


Handlers = dict[str, HandlerSpec]
