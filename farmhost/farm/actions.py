"""The farm_action table: every action's function, effect and timeout, and the handler rows built from it.

Each handler authorises the source group (main only unless the farm profile says otherwise), applies the
control gate (a readable profile; in production a validated one), the service policy (denied domains, the closed
service surface, the profile's narrowing), then the actuator rules (farm/gate.py), runs the action within its timeout and
appends one audit line, whatever the outcome. That is why the rows are `main_only=False`: a refusal must
happen here, where it is audited, not in the router.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import FarmhostError, NotFound
from farmhost.farm import gate, policy, stopped
from farmhost.farm.assist import ha_assist
from farmhost.farm.audit import AuditLog, approval_keys
from farmhost.farm.core_actions import check_calls, ha_call_service, ha_get_status, ha_restart, ha_set_entity
from farmhost.farm.dashboard_actions import (
    ha_apply_dashboard,
    ha_dashboard_get,
    ha_dashboard_patch,
    ha_dashboard_validate,
)
from farmhost.farm.effect_rules import ON
from farmhost.farm.history import ha_history
from farmhost.farm.screenshots import ha_capture_screenshot
from farmhost.farm.state import farm_state_refresh
from farmhost.ipc.handlers import (
    DEFAULT_HANDLER_TIMEOUT,
    Approved,
    AsyncHandler,
    Effect,
    Handlers,
    HandlerSpec,
    RequestContext,
)
from farmhost.protocol.codes import FARM_ACTIONS, ErrorCode
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.params import ACTION_PARAMS, parse_params
from farmhost.protocol.requests import (
    CONTROL_ACTIONS,
    FILE_WRITING_ACTIONS,
    AnyRequest,
    FarmActionRequest,
)
from farmhost.store import groups
from farmhost.store.db import now_utc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime

    from farmhost.config import Settings
    from farmhost.farm.deps import FarmAction, FarmDeps
    from farmhost.farm.rules import ControlCall
    from farmhost.layout import DataLayout
    from farmhost.store.approvals import ApprovalRow
    from farmhost.store.db import Database

ACTION_NAMES: Final = FARM_ACTIONS
# The router's own timeout sits this far behind the action's, so the action's clearer message wins.
ROUTER_MARGIN: Final = 2.0


@dataclass(frozen=True, kw_only=True)
class FarmActionSpec:
    """One row of the farm table."""

    run: FarmAction
    effect: Effect
    timeout: float = DEFAULT_HANDLER_TIMEOUT


def _effect(action: str) -> Effect:
    return Effect.EXTERNAL if action in CONTROL_ACTIONS | FILE_WRITING_ACTIONS else Effect.READ


def _row(run: FarmAction, name: str, timeout: float = DEFAULT_HANDLER_TIMEOUT) -> FarmActionSpec:
    return FarmActionSpec(run=run, effect=_effect(name), timeout=timeout)


ACTIONS: Final[dict[str, FarmActionSpec]] = {
    "ha_get_status": _row(ha_get_status, "ha_get_status"),
    "ha_call_service": _row(ha_call_service, "ha_call_service"),
    "ha_set_entity": _row(ha_set_entity, "ha_set_entity"),
    # HA restarts in ~7 s here, 30-90 s on a Raspberry Pi; core_actions.RESTART_TIMEOUT is 150 s.
    "ha_restart": _row(ha_restart, "ha_restart", timeout=160.0),
    "ha_dashboard_get": _row(ha_dashboard_get, "ha_dashboard_get"),
    "ha_dashboard_validate": _row(ha_dashboard_validate, "ha_dashboard_validate"),
    "ha_dashboard_patch": _row(ha_dashboard_patch, "ha_dashboard_patch"),
    "ha_apply_dashboard": _row(ha_apply_dashboard, "ha_apply_dashboard"),
    "ha_capture_screenshot": _row(ha_capture_screenshot, "ha_capture_screenshot", timeout=35.0),
    "farm_state_refresh": _row(farm_state_refresh, "farm_state_refresh"),
    # Three HA calls (exposed entities, registry, states) and Assist's own service calls, each within 10 s.
    "ha_assist": _row(ha_assist, "ha_assist"),
    "ha_history": _row(ha_history, "ha_history"),
}
assert set(ACTIONS) == set(ACTION_NAMES), "every FarmActionName needs a row"


def farm_handlers(deps: FarmDeps, *, audit: AuditLog | None = None) -> Handlers:
    """The `farm_action:<name>` handler rows, all sharing `deps` and one audit log.

    Args:
        deps: the farm's runtime (settings, layout, HA client or None, dashboards dir).
        audit: the audit log; by default `farm-state/audit.ndjson`, rotated at FARMHOST_REQUEST_LOG_BYTES.
    """
    log = audit or AuditLog(deps.layout.farm_state, max_bytes=deps.settings.request_log_max_bytes)
    return {
        f"farm_action:{name}": HandlerSpec(
            effect=spec.effect, run=_handler(deps, log, name, spec), timeout=spec.timeout + ROUTER_MARGIN
        )
        for name, spec in ACTIONS.items()
    }


def _handler(deps: FarmDeps, audit: AuditLog, name: str, spec: FarmActionSpec) -> AsyncHandler:
    async def run(ctx: RequestContext, request: AnyRequest) -> Outcome:
        params = request.params if isinstance(request, FarmActionRequest) else {}
        started = time.perf_counter()
        code: ErrorCode | None = ErrorCode.INTERNAL
        try:
            result = await _guarded(deps, ctx, name, spec, params)
            code = None
            return Outcome(result=result)
        except FarmhostError as err:
            code = err.code
            raise
        except asyncio.CancelledError:
            code = ErrorCode.INTERRUPTED  # the host is stopping
            raise
        finally:
            audit.record(
                at=ctx.now,
                group=ctx.group.folder,
                request_id=ctx.request_id,
                action=name,
                params=params,
                error_code=code,
                duration_ms=round((time.perf_counter() - started) * 1000),
                extra=approval_keys(ctx.approved),
            )
            if deps.receipts is not None and ctx.approved is None:  # an approved call runs outside any agent run
                deps.receipts.action(group=ctx.group.folder, action=name, params=params, code=code)

    return run


def approved_runner(
    handlers: Handlers, *, settings: Settings, layout: DataLayout, db: Database, clock: Callable[[], datetime] = now_utc
) -> Callable[[ApprovalRow, Approved], Awaitable[Any]]:
    """What runs an approved call: the stored action and params through its farm handler, as the asking group.

    The handler authorises and checks the call again (the profile may have changed since it was asked), counts it
    against the rates and writes the audit line with the approver; a refusal or failure raises FarmhostError.
    """

    async def run(row: ApprovalRow, approved: Approved) -> Any:
        with db.tx() as conn:
            group = groups.get_group(conn, row.group_folder)
        if group is None:
            raise NotFound(f"the group {row.group_folder} is not registered any more")
        spec = handlers[f"farm_action:{row.action}"]
        assert spec.run is not None, "farm actions are READ/EXTERNAL handlers"
        ctx = RequestContext(
            group=group, settings=settings, layout=layout, db=db, now=clock(), request_id=row.request_id,
            approved=approved,
        )  # fmt: skip
        request = FarmActionRequest.model_validate(
            {"type": "farm_action", "requestId": row.request_id, "action": row.action, "params": row.params}
        )
        outcome = await spec.run(ctx, request)
        return outcome.result

    return run


def permit_target(call: ControlCall) -> str | float | None:
    """The state an approved call asks for, as the rules on effects match it (None: whatever the call does)."""
    if call.turns_on:
        return ON
    if isinstance(call.value, bool):
        return None
    if isinstance(call.value, int | float):
        return float(call.value)
    if isinstance(call.value, str):
        return call.value
    return None


async def _guarded(deps: FarmDeps, ctx: RequestContext, name: str, spec: FarmActionSpec, params: dict[str, Any]) -> Any:
    loaded = policy.load_profile(deps.settings.profile_path)
    policy.authorise_group(name, folder=ctx.group.folder, is_main=ctx.group.is_main, loaded=loaded)
    policy.check_control(name, farm_mode=deps.settings.farm_mode, loaded=loaded)
    checked = parse_params(ACTION_PARAMS[name], params, name)
    check_calls(checked, loaded)  # what could never run is refused before the rules ask anyone for approval
    call = gate.describe(name, checked)
    if call is not None:
        asked = checked.model_dump(mode="json", exclude_none=True)
        stopped.refuse_while_paused(ctx.db, call, asked, loaded.rules)  # before anyone is asked for approval
        await gate.admit(deps, ctx, call, asked, loaded)
        if ctx.approved is not None and deps.effects is not None:
            deps.effects.permit(call.entities, permit_target(call))  # before HA is called: its effect is approved
    try:
        async with asyncio.timeout(spec.timeout):
            return await spec.run(deps, ctx, checked)
    except TimeoutError:
        raise FarmhostError(f"{name} did not finish within {spec.timeout:g} s", code=ErrorCode.TIMEOUT) from None
