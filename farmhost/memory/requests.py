"""The memory_action table: memory_search and memory_get (read-only, any group for its own folder)."""

from __future__ import annotations

from typing import Final

from farmhost.errors import Unauthorized, Unavailable
from farmhost.ipc.handlers import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest


async def _not_yet(ctx: RequestContext, request: AnyRequest) -> Outcome:
    assert isinstance(request, MemoryActionRequest)
    folder = request.groupFolder or ctx.group.folder
    if folder != ctx.group.folder and not ctx.group.is_main:
        raise Unauthorized(f"group {ctx.group.folder!r} may only search its own memory, not {folder!r}")
    raise Unavailable("memory search is not available in this farmhost version yet")


HANDLERS: Final[Handlers] = {
    "memory_action:memory_search": HandlerSpec(effect=Effect.READ, run=_not_yet),
    "memory_action:memory_get": HandlerSpec(effect=Effect.READ, run=_not_yet),
}
