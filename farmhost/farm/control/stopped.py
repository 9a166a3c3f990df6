"""While agent runs are paused (the MQTT switch, /stop), a control action runs only if it just makes things safe.

Pausing ends the agents' runs, but that is not where the stop can rest: a hostile agent may ignore SIGTERM for the
grace before SIGKILL, a request it wrote a moment before is still in its queue, and another site's call arrives
as the main group's. So the host itself holds the stop: every control action is refused `not_allowed` until
`/resume`, except one that only puts the entities it names in their safe state (gate.only_safe), which stays open
to every group that may control them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from farmhost.errors import NotAllowed
from farmhost.farm.control import actuator_gate as gate
from farmhost.store import host_state

if TYPE_CHECKING:
    from farmhost.farm.control.rules import ActuatorRule, ControlCall
    from farmhost.store.db import Database


def refuse_while_paused(
    db: Database,
    call: ControlCall,
    params: dict[str, Any],
    rules: tuple[ActuatorRule, ...],
    attributes: gate.Attributes,
) -> None:
    """Refuse `call` while agent runs are paused, unless it only makes things safe (`attributes`: gate.attributes_of).

    Raises:
        NotAllowed: agents are paused, with why (who stopped them, when) and what is still allowed.
    """
    reason = host_state.get(db.conn, host_state.AGENTS_PAUSED)
    if reason is None or gate.only_safe(call, params, rules, attributes):
        return
    raise NotAllowed(
        f"{call.action} is refused: agents are paused ({reason}): until /resume only turning devices to their safe "
        "state is allowed (off, closed, the low end of a range)"
    )
