"""The pause of agent runs (the MQTT switch, /stop): stored, so it survives restarts, and applied to the runtime."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Final

from farmhost.store import host_state
from farmhost.store.db import Database

if TYPE_CHECKING:
    from farmhost.agents.runtime import AgentRuntime

PAUSED_KEY: Final = host_state.AGENTS_PAUSED
# The reason of the emergency stop's pause begins so (farmhost/emergency_stop.py): only /resume lifts it.
STOPPED_IN_CHAT: Final = "stopped by /stop"


def stopped_in_chat(reason: str | None) -> bool:
    """Whether the pause in force is the emergency stop's, which only /resume in the main chat lifts."""
    return reason is not None and reason.startswith(STOPPED_IN_CHAT)


def restore_pause(db: Database, runtime: AgentRuntime) -> None:
    """A pause survives restarts: apply the stored one."""
    with db.tx() as conn:
        reason = host_state.get(conn, PAUSED_KEY)
    if reason is not None:
        runtime.pause(reason)


class StopHeld(Exception):
    """A resume asked of a pause the emergency stop set, by anything but /resume in the main chat."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the agents were {reason}; only /resume in the main chat lifts it")


def set_paused(
    db: Database,
    runtime: AgentRuntime,
    paused: bool,
    *,
    by: str,
    at: datetime,
    reason: str | None = None,
    lifts_stop: bool = False,
) -> bool:
    """Pause or resume, stored; False when it already was so (nothing changes twice).

    A `reason` given with `paused` (the emergency stop's "stopped by /stop (who, when)") replaces the reason of a
    pause already in force, so /status and doctor name the stop rather than an earlier pause. Only a caller that
    `lifts_stop` (/resume) may end the emergency stop's pause: on some brokers any login may press the MQTT switch.

    Raises:
        StopHeld: a resume of the emergency stop's pause without `lifts_stop`; nothing changes.
    """
    if not paused and not lifts_stop and stopped_in_chat(runtime.paused):
        raise StopHeld(runtime.paused or "")
    if paused == (runtime.paused is not None) and (not paused or reason is None or reason == runtime.paused):
        return False
    with db.tx() as conn:
        if paused:
            reason = reason or f"paused by {by} at {at:%Y-%m-%d %H:%M} UTC"
            host_state.put(conn, PAUSED_KEY, reason)
        else:
            host_state.delete(conn, PAUSED_KEY)
    if paused:
        assert reason is not None
        runtime.pause(reason)
    else:
        runtime.resume()
    return True
