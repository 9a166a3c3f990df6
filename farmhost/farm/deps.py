"""FarmDeps: what every farm action receives, assembled once by the app (no globals, no lookups)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farmhost.farm.dashboards.screenshots.ha_user import ScreenshotUser

if TYPE_CHECKING:
    from farmhost.config import FarmSettings
    from farmhost.farm.control.effect_rules import EffectRules
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.farm.homeassistant.live_view import LiveView
    from farmhost.farm.state.collector import StateCollector
    from farmhost.farm.state.receipts import ReceiptBook
    from farmhost.handling import RequestContext
    from farmhost.layout import DataLayout


@dataclass(frozen=True, kw_only=True)
class FarmDeps:
    """The farm's runtime: the HA client (None when HA is not configured), the farm's settings and paths."""

    settings: FarmSettings
    layout: DataLayout
    ha: HAClient | None
    dashboards_dir: Path  # the working copies of the staged dashboards (data dir), seeded from the repo's dashboards/
    state: StateCollector | None = None  # the running collector, the one writer of farm-state/ (None: HA off)
    screenshot_user: ScreenshotUser = field(default_factory=ScreenshotUser)  # the browser's read-only HA user
    effects: EffectRules | None = None  # the rules on effects: an approved run registers its permit there
    receipts: ReceiptBook | None = None  # each control action's outcome, for the receipt under a run's reply
    view: LiveView | None = None  # the live view of HA (which entity drives which, for the dashboard policy)


# One farm action: validated params in, a JSON-able result out; raises FarmhostError subclasses for failures.
# An action gets its params already validated by their model (farmhost.protocol.params.ACTION_PARAMS).
FarmAction = Callable[["FarmDeps", "RequestContext", Any], Awaitable[Any]]
