"""The screenshot request's params: dashboard and view names (never URLs), sizes, zoom, wait and selector, checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from farmhost.errors import InvalidRequest
from farmhost.farm.dashboards import DEFAULT_DASHBOARD, VIEW_PATH_RE, check_name, url_path

WIDTH_RANGE: Final = (320, 3840)
HEIGHT_RANGE: Final = (240, 2160)
ZOOM_RANGE: Final = (0.5, 3.0)
MAX_WAIT_MS: Final = 15_000
MAX_SELECTOR_CHARS: Final = 200
# CSS only: names, classes, ids, attributes, pseudo-classes, combinators. No backslash escapes, slashes, `@`, `{}`,
# `;` or `>>` (Playwright's selector chaining), so the string cannot reach another selector engine.
SELECTOR_RE: Final = re.compile(r"^[A-Za-z0-9 _.#:,>+~*\[\]=\"'()-]+$")
PARAMS: Final = frozenset({"dashboard", "view", "width", "height", "zoom", "waitMs", "selector"})


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

    @property
    def url_path(self) -> str:
        """The path of the page in HA's frontend (never an absolute URL)."""
        return f"/{url_path(self.dashboard)}" + (f"/{self.view}" if self.view else "")


def parse_params(params: dict[str, Any]) -> ShotParams:
    """Check the agent's params: names not URLs, sizes in range.

    Raises:
        InvalidRequest: an unknown param, a path or URL where a name belongs, a value out of range.
    """
    unknown = sorted(set(params) - PARAMS)
    if unknown:
        raise InvalidRequest(f"unknown params {unknown}; ha_capture_screenshot takes {sorted(PARAMS)}")
    params = {key: value for key, value in params.items() if value is not None}  # null means "the default"
    view = params.get("view")
    if view is not None and not (isinstance(view, str) and VIEW_PATH_RE.fullmatch(view)):
        raise InvalidRequest(
            f"view {repr(view)[:80]} is not a view path: use 1-64 letters, digits, '_' or '-' (a name, never a URL)"
        )
    return ShotParams(
        dashboard=check_name(params.get("dashboard", DEFAULT_DASHBOARD)),
        view=view,
        width=int(_number(params, "width", 1280, WIDTH_RANGE)),
        height=int(_number(params, "height", 800, HEIGHT_RANGE)),
        zoom=float(_number(params, "zoom", 1.0, ZOOM_RANGE, whole=False)),
        wait_ms=int(_number(params, "waitMs", 0, (0, MAX_WAIT_MS))),
        selector=_selector(params.get("selector")),
    )


def _number(
    params: dict[str, Any], key: str, default: float, bounds: tuple[float, float], *, whole: bool = True
) -> float:
    value = params.get(key, default)
    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not bounds[0] <= value <= bounds[1]:
        kind = "whole number" if whole else "number"
        raise InvalidRequest(f"{key} must be a {kind} from {bounds[0]:g} to {bounds[1]:g} (got {repr(value)[:40]})")
    return float(value)


def _selector(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SELECTOR_CHARS:
        raise InvalidRequest(f"selector must be a CSS selector of 1-{MAX_SELECTOR_CHARS} characters")
    if not SELECTOR_RE.fullmatch(value) or ">>" in value:
        raise InvalidRequest(
            "selector may only use letters, digits, spaces and _ . # : , > + ~ * [ ] = \" ' ( ) - "
            "(a CSS selector such as 'hui-entities-card' or '#main .card')"
        )
    return value.strip()
