"""The farm_action table: each action's effect class and policy; execution arrives with the HA client."""

from __future__ import annotations

from typing import Final, get_args

from farmhost.errors import Unavailable
from farmhost.ipc.handlers import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import CONTROL_ACTIONS, FILE_WRITING_ACTIONS, AnyRequest, FarmActionName

ACTION_NAMES: Final = tuple(get_args(FarmActionName))


async def _home_assistant_off(ctx: RequestContext, request: AnyRequest) -> Outcome:
    if not ctx.settings.ha_enabled:
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    raise Unavailable("this farmhost version does not run Home Assistant actions yet")


def _effect(action: str) -> Effect:
    return Effect.EXTERNAL if action in CONTROL_ACTIONS | FILE_WRITING_ACTIONS else Effect.READ


HANDLERS: Final[Handlers] = {
    f"farm_action:{name}": HandlerSpec(effect=_effect(name), run=_home_assistant_off, main_only=True)
    for name in ACTION_NAMES
}
