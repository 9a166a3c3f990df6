"""The screenshot request as the capture uses it: the checked params (farmhost.protocol.params) and the page path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farmhost.farm.dashboards.lovelace import url_path
from farmhost.protocol.params import DEFAULT_DASHBOARD, HaCaptureScreenshotParams
from farmhost.protocol.params import parse_params as parse_action_params


@dataclass(frozen=True, kw_only=True)
class ShotParams:
    """A checked ha_capture_screenshot request."""

    dashboard: str = DEFAULT_DASHBOARD
    view: str | None = None
    width: int = 1280
    height: int = 800
    zoom: float = 1.0
    wait_ms: int = 0
    selector: str | None = None

    @classmethod
    def of(cls, params: HaCaptureScreenshotParams) -> ShotParams:
        """The capture's view of the validated params."""
        selector = params.selector.strip() if params.selector is not None else None
        return cls(
            dashboard=params.dashboard,
            view=params.view,
            width=params.width,
            height=params.height,
            zoom=float(params.zoom),
            wait_ms=params.waitMs,
            selector=selector,
        )

    @property
    def url_path(self) -> str:
        """The path of the page in HA's frontend (never an absolute URL)."""
        return f"/{url_path(self.dashboard)}" + (f"/{self.view}" if self.view else "")


def parse_params(params: dict[str, Any]) -> ShotParams:
    """Check raw params with the action's model: names not URLs, sizes in range.

    Raises:
        InvalidRequest: an unknown param, a path or URL where a name belongs, a value out of range.
    """
    return ShotParams.of(parse_action_params(HaCaptureScreenshotParams, params, "ha_capture_screenshot"))
