"""EndpointChain: the LLM endpoints in the operator's order, each failing one tried last for a cool-down.

An endpoint *fails* when it cannot be reached, does not send its answer's headers in time, or answers 5xx: the next
one is tried with the same request. A 4xx is the request's fault (a bad body, a refused key, a budget of the
endpoint's own) and is passed through, never retried elsewhere. A failed endpoint goes to the back of the order for
`cooldown` seconds (it is still tried when every other one failed too), so a dead hosted model costs one failed
connection per cool-down rather than one per request. Pure state and decisions; the HTTP is in
proxy/upstream.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from farmhost.config import LlmEndpoint

logger = logging.getLogger("farmhost.agents.proxy")


@dataclass
class _Health:
    cooling_until: float = 0.0
    failing: bool = False  # logged as failing, not yet as answering again


class EndpointChain:
    """The order to try endpoints in, and what each did last."""

    def __init__(
        self, endpoints: tuple[LlmEndpoint, ...], *, cooldown: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.endpoints = endpoints
        self._cooldown = cooldown
        self._clock = clock
        self._health = {e.number: _Health() for e in endpoints}

    def order(self) -> list[LlmEndpoint]:
        """The endpoints to try for the next request: those not cooling down first, each group in the set order."""
        now = self._clock()
        ready = [e for e in self.endpoints if self._health[e.number].cooling_until <= now]
        cooling = [e for e in self.endpoints if self._health[e.number].cooling_until > now]
        return ready + cooling

    def failed(self, endpoint: LlmEndpoint, reason: str, *, next_one: LlmEndpoint | None) -> None:
        """`endpoint` did not answer; it is tried last for the cool-down (logged when it starts failing)."""
        health = self._health[endpoint.number]
        health.cooling_until = self._clock() + self._cooldown
        if not health.failing:
            health.failing = True
            then = f"trying endpoint {next_one.number} ({next_one.label})" if next_one else "no other endpoint left"
            logger.warning(
                "LLM endpoint %d (%s) failed: %s; it is tried last for %g s; %s",
                endpoint.number,
                endpoint.label,
                reason,
                self._cooldown,
                then,
            )

    def answered(self, endpoint: LlmEndpoint) -> None:
        """`endpoint` answered (any status below 500): its cool-down ends (logged when it was failing)."""
        health = self._health[endpoint.number]
        health.cooling_until = 0.0
        if health.failing:
            health.failing = False
            logger.warning("LLM endpoint %d (%s) answers again", endpoint.number, endpoint.label)
