"""The screenshot browser: Debian's Chromium under Playwright, confined by confine.py, photographing one HA page.

It loads the page, waits for HA's panel (or its login page: the token was refused), then for the cards or the
agent's selector, checks the view exists, lets icons settle and takes a viewport PNG.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from farmhost.errors import FarmhostError, InvalidRequest, NotFound, Unavailable
from farmhost.farm.dashboards.screenshots.confine import WEBRTC_FLAGS, Confinement
from farmhost.protocol.codes import ErrorCode

if TYPE_CHECKING:
    from playwright.async_api import Page

    from farmhost.farm.dashboards.screenshots.params import ShotParams

# Debian's package (`apt-get install chromium`); Playwright's own browser download cannot work offline.
CHROMIUM_PATH: Final = Path("/usr/bin/chromium")
LAUNCH_ARGS: Final = (
    "--no-sandbox",  # the daemon may run as root in a container; the page is confined by confine.py
    "--headless",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # A page fulfilled by confine.py's route has no remote address, so Chromium counts it as public and would
    # refuse its WebSocket to a local HA; the route already keeps the page from reaching any other address.
    "--disable-features=LocalNetworkAccessChecks",
    *WEBRTC_FLAGS,
)
# A second wall under confine.py's route: Chromium sends whatever it fetches itself through a proxy nobody serves,
# except to Home Assistant's own host and port (`<-loopback>`: other ports of loopback too). A request the route has
# paused when a capture ends early could otherwise go out unexamined as Playwright lets go of the browser (a CI run
# saw one reach another origin). Chromium's flags, not Playwright's `proxy` option: that one would also send
# `route.fetch` (Playwright's own requests to HA) to the proxy.
NOWHERE_PROXY: Final = "http://127.0.0.1:1"


def launch_args(base: str) -> list[str]:
    """Chromium's command-line flags for a capture of Home Assistant at `base`."""
    return [*LAUNCH_ARGS, *network_wall(base)]


def network_wall(base: str) -> tuple[str, str]:
    """Chromium's flags that let it reach only `base`'s host and port by itself."""
    home = urlsplit(base)
    port = home.port or (443 if home.scheme == "https" else 80)
    host = f"[{home.hostname}]" if home.hostname and ":" in home.hostname else home.hostname
    # `<-loopback>` first: Chromium applies the rules in order, and after HA's it would take HA's bypass back too.
    return f"--proxy-server={NOWHERE_PROXY}", f"--proxy-bypass-list=<-loopback>;{host}:{port}"


# Playwright's CSS engine pierces open shadow roots, so these find the cards inside HA's web components.
CARD_SELECTOR: Final = "hui-card, hui-entities-card, hui-gauge-card, hui-tile-card, hui-markdown-card, hui-error-card"
PANEL_OR_LOGIN: Final = "ha-panel-lovelace, ha-authorize"
SETTLE_MS: Final = 400  # icons and fonts arrive just after the cards; animations are disabled for the shot itself
NETWORK_IDLE_MS: Final = 5000
APPEAR_MS: Final = 15_000  # HA's frontend shows cards ~2 s after loading; a selector that never matches fails sooner
_NET_ERROR: Final = re.compile(r"net::ERR_[A-Z_]+")


def zoom_script(zoom: float) -> str:
    """Zoom as a browser's page zoom, set before the first layout so the dashboard's columns fit the zoomed width."""
    return f"document.addEventListener('DOMContentLoaded', () => {{ document.body.style.zoom = '{zoom:g}'; }});"


async def take_shot(
    *, chromium: Path, base_url: str, token: str, shot: ShotParams, deadline: float
) -> tuple[bytes, int]:
    """Open HA's page for `shot` logged in, wait for its cards; return the viewport as PNG and the cards counted."""
    if not os.access(chromium, os.X_OK):
        raise Unavailable(
            f"Chromium is not installed at {chromium}; install Debian's chromium (apt-get install chromium)"
        )

    def left_ms() -> float:
        return max(1.0, (deadline - time.monotonic()) * 1000)

    confinement = Confinement(base_url, token)
    # Imported here: Playwright costs ~0.5 s at import, which every daemon start and CLI command would pay.
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        try:
            browser = await pw.chromium.launch(
                executable_path=str(chromium),
                headless=True,
                args=launch_args(confinement.base),
                timeout=left_ms(),
            )
        except PlaywrightError as err:
            raise Unavailable(f"Chromium at {chromium} did not start: {_first_line(err)}") from None
        try:
            context = await browser.new_context(
                viewport={"width": shot.width, "height": shot.height},
                service_workers="block",
                accept_downloads=False,
            )
            await confinement.install(context)
            if shot.zoom != 1:
                await context.add_init_script(zoom_script(shot.zoom))
            page = await context.new_page()
            return await _load_and_shoot(page, confinement.base + shot.url_path, shot, left_ms)
        finally:
            await browser.close()


async def _load_and_shoot(page: Page, url: str, shot: ShotParams, left_ms: Callable[[], float]) -> tuple[bytes, int]:
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    path = urlsplit(url).path
    try:
        response = await page.goto(url, wait_until="domcontentloaded", timeout=left_ms())
    except PlaywrightError as err:
        if isinstance(err, PlaywrightTimeout):
            raise FarmhostError(f"Home Assistant did not serve {path} in time", code=ErrorCode.TIMEOUT) from None
        reason = _NET_ERROR.search(str(err))  # only the browser's error name: the message also has HA's address
        raise Unavailable(f"Home Assistant did not answer ({reason[0] if reason else 'no connection'})") from None
    if response is not None and response.status == 404:
        raise NotFound(f"Home Assistant has no dashboard at {path} (was it applied with ha_apply_dashboard?)")
    if response is not None and response.status >= 400:
        raise FarmhostError(f"Home Assistant answered {response.status} for {path}", code=ErrorCode.UPSTREAM_ERROR)
    await _wait(page, PANEL_OR_LOGIN, path, left_ms, "the dashboard")
    if await page.locator("ha-authorize").count():
        raise FarmhostError(
            "Home Assistant showed its login page: it refused the screenshot user's token",
            code=ErrorCode.UPSTREAM_ERROR,
        )
    selector = CARD_SELECTOR
    if shot.selector is not None:
        if not await page.evaluate(
            "s => { try { document.querySelector(s); return true } catch { return false } }", shot.selector
        ):
            raise InvalidRequest(f"selector {shot.selector!r} is not valid CSS")
        selector = f"css={shot.selector}"
    await _wait(page, selector, path, left_ms, "the cards" if shot.selector is None else repr(shot.selector))
    if shot.view is not None:
        await _check_view(page, shot)
    # A card that keeps polling must not cost the picture; the settle delay still applies.
    with contextlib.suppress(PlaywrightError):
        await page.wait_for_load_state("networkidle", timeout=min(NETWORK_IDLE_MS, left_ms()))
    await page.wait_for_timeout(min(SETTLE_MS + shot.wait_ms, left_ms()))
    # Counted as the picture is taken (cards render one by one). HA wraps every card in hui-card: count each once.
    matched = await page.locator(selector if shot.selector is not None else "hui-card").count()
    png = await page.screenshot(type="png", animations="disabled", caret="hide", timeout=left_ms())
    return png, matched


async def _wait(page: Page, selector: str, path: str, left_ms: Callable[[], float], what: str) -> None:
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_selector(selector, state="visible", timeout=min(APPEAR_MS, left_ms()))
    except PlaywrightError as err:
        if isinstance(err, PlaywrightTimeout):
            raise FarmhostError(f"{what} did not appear on {path} in time", code=ErrorCode.TIMEOUT) from None
        raise FarmhostError(f"the page {path} failed: {_first_line(err)}", code=ErrorCode.UPSTREAM_ERROR) from None


async def _check_view(page: Page, shot: ShotParams) -> None:
    """HA shows the first view for an unknown view path; refuse instead of returning the wrong picture."""
    roots = page.locator("hui-root")
    if not await roots.count():
        return
    views = await roots.first.evaluate(
        "el => { const v = el.lovelace && el.lovelace.config && el.lovelace.config.views;"
        " return Array.isArray(v) ? v.map((view, i) => String(view.path ?? i)) : null; }"
    )
    # A view is found by its path or by its index (HA's own /<dashboard>/0 links).
    if isinstance(views, list) and shot.view not in {*views, *map(str, range(len(views)))}:
        raise NotFound(f"dashboard {shot.dashboard!r} has no view {shot.view!r}; its views are {views}")


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
