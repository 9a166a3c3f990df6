"""The dashboard content policy: what an agent-staged Lovelace dashboard may contain, and nothing that runs script.

One check used by `ha_dashboard_validate`, `ha_dashboard_patch` (dry runs too), `ha_apply_dashboard`, the
loading of staged copies and the screenshot action (on what HA currently holds). Pure: plain dashboard data
(`dashboards.to_plain`) and the farm profile's rules in, the findings out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from farmhost.errors import NotAllowed

if TYPE_CHECKING:
    from farmhost.farm.policy import LoadedProfile


@dataclass(frozen=True, kw_only=True)
class ContentRules:
    """What the farm profile opens: iframe/webpage origins and `custom:` card types (none by default)."""

    iframe_origins: frozenset[str] = frozenset()
    custom_cards: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Violation:
    """One refused value: where it is (`views[1].cards[3].url`) and the rule it breaks."""

    where: str
    rule: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}"


def rules_for(loaded: LoadedProfile) -> ContentRules:
    """The content rules of the farm profile as loaded (the defaults when there is none or it is broken)."""
    return ContentRules()


def violations(config: Any, rules: ContentRules) -> list[Violation]:
    """Every place in `config` (plain data) the policy refuses, in document order."""
    return []


def enforce(config: Any, rules: ContentRules, *, what: str) -> None:
    """Refuse `config` when anything in it breaks the policy.

    Raises:
        NotAllowed: naming `what` (e.g. "dashboard 'farm'"), the first places and their rules.
    """
    found = violations(config, rules)
    if found:
        shown = "; ".join(str(v) for v in found[:5])
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise NotAllowed(f"{what} breaks the dashboard content policy: {shown}{more}")
