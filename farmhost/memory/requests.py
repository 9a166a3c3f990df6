"""The memory_action table: memory_search and memory_get (read-only; own folder, the global one, any from main)."""

from __future__ import annotations

from typing import Final

from farmhost.errors import Unavailable
from farmhost.ipc.handlers import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.memory.access import target_folder
from farmhost.memory.get import memory_get
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest


async def _not_yet(ctx: RequestContext, request: AnyRequest) -> Outcome:
    assert isinstance(request, MemoryActionRequest)
    target_folder(ctx, request.params, request.groupFolder)
    raise Unavailable("memory search is not available in this farmhost version yet")


HANDLERS: Final[Handlers] = {
    "memory_action:memory_search": HandlerSpec(effect=Effect.READ, run=_not_yet),
    "memory_action:memory_get": HandlerSpec(effect=Effect.READ, run=memory_get),
}
