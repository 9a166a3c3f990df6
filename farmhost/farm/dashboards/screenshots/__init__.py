"""ha_capture_screenshot: a picture of one HA dashboard, taken by a browser that can only look, saved in the workspace.

The pieces: params.py (the request), files.py (the workspace file), ha_user.py (the read-only HA user whose
token the browser holds), confine.py + ws_filter.py (what the browser may reach and say), browser.py (Chromium
and the page). This module is the action: params, the held `screenshots/` directory, HA's current content of
the dashboard through the content policy, the token, the picture, the file, all within CAPTURE_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import FarmhostError, NotFound, Unavailable
from farmhost.farm.control import policy
from farmhost.farm.dashboards import policy as dashboard_policy
from farmhost.farm.dashboards.lovelace import url_path
from farmhost.farm.dashboards.screenshots.browser import CHROMIUM_PATH, take_shot
from farmhost.farm.dashboards.screenshots.files import (
    SCREENSHOTS_DIR,
    file_name,
    open_screenshots_dir,
    png_size,
    write_png,
)
from farmhost.farm.dashboards.screenshots.params import ShotParams, parse_params
from farmhost.farm.homeassistant.errors import HaNotFound, HaUnavailable
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.params import HaCaptureScreenshotParams

if TYPE_CHECKING:
    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext

__all__ = ["CAPTURE_TIMEOUT", "CHROMIUM_PATH", "ShotParams", "capture", "ha_capture_screenshot", "parse_params"]

# A capture takes 3-6 s here (browser start ~0.5 s, HA's frontend ~2 s). 30 s leaves room for waitMs (15 s at
# most) and a slow HA, and stays under the agent client's 40 s wait; the action's row in actions.py must exceed it.
CAPTURE_TIMEOUT: Final = 30.0


async def ha_capture_screenshot(
    deps: FarmDeps, ctx: RequestContext, params: HaCaptureScreenshotParams
) -> dict[str, Any]:
    """The farm action: `{dashboard?, view?, width?, height?, zoom?, waitMs?, selector?}` -> the saved PNG.

    Returns:
        `{path (relative to the group's workspace), width, height, bytes, urlPath, matched}`.

    Raises:
        InvalidRequest, NotFound, NotAllowed (also: HA's dashboard breaks the content policy), Unavailable,
        FarmhostError (timeout, upstream_error).
    """
    shot = ShotParams.of(params)
    settings, ha = deps.settings, deps.ha
    if not settings.ha.enabled or settings.ha.url is None or ha is None:
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    base_url = settings.ha.url
    dir_fd = open_screenshots_dir(ctx.layout.workspace(ctx.group.folder))  # before seconds are spent on HA
    try:
        async with _bounded(shot):
            deadline = time.monotonic() + CAPTURE_TIMEOUT
            await check_current_dashboard(ha, shot, profile_path=settings.profile_path)
            token = await deps.screenshot_user.token(ha=ha, db=ctx.db, base_url=base_url)
            return await _shoot_into(
                dir_fd,
                chromium=CHROMIUM_PATH,
                base_url=base_url,
                token=token,
                name=file_name(shot, ctx),
                shot=shot,
                deadline=deadline,
            )
    finally:
        os.close(dir_fd)


async def check_current_dashboard(ha: HAClient, shot: ShotParams, *, profile_path: Path) -> None:
    """HA's content of the dashboard now (someone may have edited it in HA) must pass the content policy.

    Raises:
        NotFound: HA has no such dashboard (or it was never saved).
        NotAllowed: the content breaks the policy.
    """
    path = url_path(shot.dashboard)
    try:
        config = await ha.ws_command("lovelace/config", url_path=path)
    except HaNotFound:
        raise NotFound(
            f"Home Assistant has no dashboard at /{path} (was it applied with ha_apply_dashboard?)"
        ) from None
    except HaUnavailable:  # its message names HA's address, which the agent is not shown
        raise Unavailable("Home Assistant did not answer (no connection); try again later") from None
    rules = dashboard_policy.rules_for(policy.load_profile(profile_path))
    dashboard_policy.enforce(config, rules, what=f"Home Assistant's dashboard {'/' + path!r}")


async def capture(
    *, chromium: Path, base_url: str, token: str, workspace: Path, name: str, shot: ShotParams
) -> dict[str, Any]:
    """Take the picture with `token` and save it as `screenshots/<name>` in `workspace` (no HA checks first).

    Raises:
        Unavailable: Chromium is missing or does not start; HA does not answer.
        NotFound: HA has no such dashboard or view; the workspace is missing.
        NotAllowed: `screenshots/` or the file name is a link or not a directory / regular file.
        InvalidRequest: the selector is not CSS the browser accepts.
        FarmhostError: HA showed its login page (upstream_error); nothing appeared in time (timeout).
    """
    dir_fd = open_screenshots_dir(workspace)
    try:
        async with _bounded(shot):
            return await _shoot_into(
                dir_fd,
                chromium=chromium,
                base_url=base_url,
                token=token,
                name=name,
                shot=shot,
                deadline=time.monotonic() + CAPTURE_TIMEOUT,
            )
    finally:
        os.close(dir_fd)


@contextlib.asynccontextmanager
async def _bounded(shot: ShotParams) -> AsyncIterator[None]:
    """CAPTURE_TIMEOUT over everything inside, as the agent's `timeout` error."""
    try:
        async with asyncio.timeout(CAPTURE_TIMEOUT):
            yield
    except TimeoutError:
        raise FarmhostError(
            f"the screenshot of {shot.url_path} took longer than {CAPTURE_TIMEOUT:g} s", code=ErrorCode.TIMEOUT
        ) from None


async def _shoot_into(
    dir_fd: int, *, chromium: Path, base_url: str, token: str, name: str, shot: ShotParams, deadline: float
) -> dict[str, Any]:
    png, matched = await take_shot(chromium=chromium, base_url=base_url, token=token, shot=shot, deadline=deadline)
    width, height = png_size(png)
    write_png(dir_fd, name, png)
    return {
        "path": f"{SCREENSHOTS_DIR}/{name}",
        "width": width,
        "height": height,
        "bytes": len(png),
        "urlPath": shot.url_path,
        "matched": matched,
    }
