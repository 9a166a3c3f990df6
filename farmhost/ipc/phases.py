"""Where one request's time goes: its phases, timed at their boundaries with a clock read each.

The request log line of a request answered from a file carries them as `phasesUs` (microseconds, in the order
they first ran), so a slower build names the phase that grew (`bench/request_phases.py`). Each lap ends the time
since the previous one, so the phases add up to the whole with nothing counted twice.
"""

from __future__ import annotations

import time
from typing import Final

# The phases, in the order a request meets them.
CLAIM: Final = "claim"  # the worker lists the queue, renames the file into the spool, takes its turn
READ: Final = "read"  # the claimed file checked through its descriptor and read
DECODE: Final = "decode"  # the bytes parsed and validated into a request
LEDGER: Final = "ledger"  # the ledger's reads and writes: the entry of the id, its result, the answered file
HANDLER: Final = "handler"  # the policy checks and the handler's own work
ENVELOPE: Final = "envelope"  # the result document built from the outcome
SETTLE: Final = "settle"  # a state change reaching the snapshots before the result (STATE requests only)
RESULT: Final = "result"  # the result file written (fsync'd in a thread) and published, the spooled file released
LOG: Final = "log"  # the daemon's log line and the request log's record, up to the request log's own write


class RequestPhases:
    """The microseconds one request spent in each phase so far; a lap costs a clock read and a dict update."""

    __slots__ = ("_last", "_spent")

    def __init__(self, start_ns: int | None = None) -> None:
        self._last = time.perf_counter_ns() if start_ns is None else start_ns
        self._spent: dict[str, int] = {}

    def lap(self, phase: str) -> None:
        """Count the time since the previous lap (or the start) to `phase`."""
        now = time.perf_counter_ns()
        self._spent[phase] = self._spent.get(phase, 0) + now - self._last
        self._last = now

    def as_us(self) -> dict[str, int]:
        """Each phase met so far, in microseconds."""
        return {phase: (ns + 500) // 1000 for phase, ns in self._spent.items()}
