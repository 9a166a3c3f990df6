"""The memory_action table: memory_search and memory_get (read-only, any group for its own folder)."""

from __future__ import annotations

from typing import Final

from farmhost.errors import Unavailable
from farmhost.ipc.handlers import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest


async def _not_yet(ctx: RequestContext, request: AnyRequest) -> Outcome:
    raise Unavailable("memory search is not available in this farmhost version yet")


HANDLERS: Final[Handlers] = {
    "memory_action:memory_search": HandlerSpec(effect=Effect.READ, run=_not_yet),
    "memory_action:memory_get": HandlerSpec(effect=Effect.READ, run=_not_yet),
}
