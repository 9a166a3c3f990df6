"""The farm_action handlers: each row of the catalog (farmhost/protocol/catalog.py) bound to its function.

Each handler authorises the source group (main only unless the farm profile says otherwise), applies the
control gate (a readable profile; in production a validated one), the service policy (denied domains, the closed
service surface, the profile's narrowing), then the actuator rules (farm/control/actuator_gate.py), runs the action within its timeout and
appends one audit line, whatever the outcome. That is why the rows are `main_only=False`: a refusal must
happen here, where it is audited, not in the router.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from farmhost.errors import FarmhostError
from farmhost.farm import assist, core_actions
from farmhost.farm.audit import AuditLog, approval_keys
from farmhost.farm.control import actuator_gate as gate
from farmhost.farm.control import policy, stopped
from farmhost.farm.control.effect_rules import ON
from farmhost.farm.control.rules import as_number
from farmhost.farm.core_actions import check_calls
from farmhost.farm.dashboards import actions as dashboard_actions
from farmhost.farm.dashboards import screenshots
from farmhost.farm.state import collector, history
from farmhost.handling import (
    ANY_ACTION,
    AsyncHandler,
    Effect,
    Handlers,
    HandlerSpec,
    Refusal,
    RefusalHandler,
    RequestContext,
    handler_key,
)
from farmhost.protocol.catalog import FARM_ACTIONS, FARM_ROWS, ActionEffect, ActionRow
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.params import parse_params
from farmhost.protocol.requests import AnyRequest, FarmActionRequest

if TYPE_CHECKING:
    from farmhost.farm.control.rules import ControlCall
    from farmhost.farm.deps import FarmAction, FarmDeps

ACTION_NAMES: Final = FARM_ACTIONS
# The router's own timeout sits this far behind the action's, so the action's clearer message wins.
ROUTER_MARGIN: Final = 2.0
# Where the implementations live: each row's function is the one of its name in exactly one of these modules.
IMPLEMENTATION_MODULES: Final = (core_actions, dashboard_actions, assist, history, screenshots, collector)


@dataclass(frozen=True, kw_only=True)
class FarmActionSpec:
    """One row of the farm table: the action's row in the catalog and the function that runs it."""

    row: ActionRow
    run: FarmAction

    @property
    def effect(self) -> Effect:
        """The router's effect class: anything but a read is never re-run after a crash."""
        return Effect.READ if self.row.effect is ActionEffect.READ else Effect.EXTERNAL

    @property
    def timeout(self) -> float:
        """The action's own timeout (the router's is ROUTER_MARGIN longer)."""
        return self.row.timeout


def implementation(name: str) -> FarmAction:
    """The async function named `name` defined in one of the implementation modules (not merely imported there).

    Raises:
        LookupError: no module, or more than one, defines it as an async function.
    """
    found = [
        function
        for module in IMPLEMENTATION_MODULES
        if getattr(function := getattr(module, name, None), "__module__", None) == module.__name__
    ]
    if len(found) != 1 or not inspect.iscoroutinefunction(found[0]):
        modules = ", ".join(module.__name__ for module in IMPLEMENTATION_MODULES)
        raise LookupError(f"the farm action {name} needs one async function of that name in one of {modules}")
    return cast("FarmAction", found[0])


ACTIONS: Final[dict[str, FarmActionSpec]] = {
    row.name: FarmActionSpec(row=row, run=implementation(row.name)) for row in FARM_ROWS
}


def farm_handlers(deps: FarmDeps, *, audit: AuditLog | None = None) -> Handlers:
    """The `farm_action:<name>` handler rows, all sharing `deps` and one audit log.

    Args:
        deps: the farm's runtime (settings, layout, HA client or None, dashboards dir).
        audit: the audit log; by default `farm-state/audit.ndjson`, rotated at FARMHOST_REQUEST_LOG_BYTES.
    """
    log = audit or AuditLog(deps.layout.farm_state, max_bytes=deps.settings.audit_max_bytes)
    rows = {
        handler_key("farm_action", name): HandlerSpec(
            effect=spec.effect,
            run=_handler(deps, log, name, spec),
            timeout=spec.timeout + ROUTER_MARGIN,
            on_refused=refusal_auditor(log, name),
        )
        for name, spec in ACTIONS.items()
    }
    # A name no row serves is refused as not valid before routing; the row is there for its audit line only.
    rows[handler_key("farm_action", ANY_ACTION)] = HandlerSpec(
        effect=Effect.READ, run=_unknown_action, on_refused=refusal_auditor(log)
    )
    return rows


async def _unknown_action(ctx: RequestContext, request: AnyRequest) -> Outcome:
    return Outcome.failure(ErrorCode.INVALID_REQUEST, f"{request.action_name} is not a farm action of this host")


def refusal_auditor(audit: AuditLog, name: str | None = None) -> RefusalHandler:
    """A farm action refused before its handler (expired, not valid) is audited like one its handler refused.

    `name` is the row's action; None for a row serving many: the farm actions for another site
    (farmhost/sites/caller.py), whose line names the request's action and its site as that row's own lines do, and
    the farm actions of a name this host does not know, whose line names the action as written.
    """

    def record(refusal: Refusal) -> None:
        action, extra = name, None
        if action is None and isinstance(refusal.request, FarmActionRequest):
            action, extra = refusal.request.action, {"site": refusal.request.site}
        elif action is None:
            action = refusal.action or ""
        audit.record(
            at=refusal.at,
            group=refusal.group,
            request_id=refusal.request_id,
            action=action,
            params=refusal.params,
            error_code=refusal.code,
            duration_ms=refusal.duration_ms,
            extra=extra,
        )

    return record


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
                request_id=ctx.approved.asked_in if ctx.approved is not None else ctx.request_id,
                action=name,
                params=params,
                error_code=code,
                duration_ms=round((time.perf_counter() - started) * 1000),
                extra=approval_keys(ctx.approved),
            )
            if deps.receipts is not None and ctx.approved is None:  # an approved call runs outside any agent run
                deps.receipts.action(group=ctx.group.folder, action=name, params=params, code=code)

    return run


def permit_target(call: ControlCall) -> str | float | None:
    """The state an approved call asks for, as the rules on effects match it (None: whatever the call does)."""
    if call.turns_on:
        return ON
    if isinstance(call.value, bool):
        return None
    if isinstance(call.value, int | float):
        return as_number(call.value)
    if isinstance(call.value, str):
        return call.value
    return None


async def _guarded(deps: FarmDeps, ctx: RequestContext, name: str, spec: FarmActionSpec, params: dict[str, Any]) -> Any:
    loaded = policy.load_profile(deps.settings.profile_path)
    policy.authorise_group(name, folder=ctx.group.folder, is_main=ctx.group.is_main, loaded=loaded)
    policy.check_control(name, farm_mode=deps.settings.mode, loaded=loaded)
    checked = parse_params(spec.row.params, params, name)
    check_calls(checked, loaded)  # what could never run is refused before the rules ask anyone for approval
    call = gate.describe(name, checked)
    if call is not None and loaded.rules:
        call = await gate.reached(deps, call)  # a group's members: what HA will act on, judged before it acts
    if call is not None:
        asked = checked.model_dump(mode="json", exclude_none=True)
        attributes = await gate.attributes_of(deps, call, loaded.rules)
        stopped.refuse_while_paused(
            ctx.db, call, asked, loaded.rules, attributes
        )  # before anyone is asked for approval
        await gate.admit(deps, ctx, call, asked, loaded, attributes)
        if ctx.approved is not None and deps.effects is not None:
            deps.effects.permit(call.entities, permit_target(call))  # before HA is called: its effect is approved
    try:
        async with asyncio.timeout(spec.timeout):
            return await spec.run(deps, ctx, checked)
    except TimeoutError:
        raise FarmhostError(f"{name} did not finish within {spec.timeout:g} s", code=ErrorCode.TIMEOUT) from None
