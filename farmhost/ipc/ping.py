"""The `ping` request: the agent's health check and the cheapest request the host answers."""

from __future__ import annotations

from farmhost.handling import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.ipc.snapshots import HostIdentity
from farmhost.protocol.envelope import Outcome, utc_stamp
from farmhost.protocol.requests import AnyRequest


def ping_handlers(identity: HostIdentity) -> Handlers:
    """The handler row for `ping`, answering with this host's version and start time."""
    result = {"pong": True, "version": identity.version, "startedAt": utc_stamp(identity.started_at)}

    async def ping(ctx: RequestContext, request: AnyRequest) -> Outcome:
        return Outcome(result=result)

    return {"ping": HandlerSpec(effect=Effect.READ, run=ping)}
