"""IPC handlers of the tasks/ queue that manage groups (main only): register_group and refresh_groups."""

from __future__ import annotations

import sqlite3
from typing import Final

from farmhost.groups.registry import new_group, register
from farmhost.handling import Change, Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, RegisterGroupRequest
from farmhost.store import chats, groups


def apply_register(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Register a chat as a non-main group and create its workspace and queues."""
    assert isinstance(request, RegisterGroupRequest)
    group = new_group(
        conn,
        jid=request.jid,
        name=request.name,
        folder=request.folder,
        trigger=request.trigger,
        requires_trigger=request.requiresTrigger,
        is_main=False,
        at=ctx.now,
    )
    register(conn, ctx.layout, group)
    ctx.changes.add(Change.GROUPS)
    return Outcome(result=group.to_dict())


def apply_refresh(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Re-read chats and groups; the host rewrites available_groups.json after the commit."""
    ctx.changes.add(Change.GROUPS)
    known = {chat.jid for chat in chats.list_chats(conn)} | {g.jid for g in groups.list_groups(conn)}
    return Outcome(result={"groups": len(known)})


HANDLERS: Final[Handlers] = {
    "register_group": HandlerSpec(effect=Effect.STATE, apply=apply_register, main_only=True),
    "refresh_groups": HandlerSpec(effect=Effect.STATE, apply=apply_refresh, main_only=True),
}
