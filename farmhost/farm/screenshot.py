"""ha_capture_screenshot: a logged-in headless Chromium picture of one HA dashboard, saved in the group's workspace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from farmhost.errors import FarmhostError, InvalidRequest, NotAllowed, NotFound, Unavailable
from farmhost.farm.dashboards import DEFAULT_DASHBOARD, VIEW_PATH_RE, check_name, url_path
from farmhost.protocol.codes import ErrorCode

if TYPE_CHECKING:
    from playwright.async_api import Page, Route, WebSocketRoute

    from farmhost.farm.deps import FarmDeps
    from farmhost.ipc.handlers import RequestContext

# Debian's package (`apt-get install chromium`); Playwright's own browser download cannot work offline.
CHROMIUM_PATH: Final = Path("/usr/bin/chromium")
# A capture takes 2.5-5 s here (browser start ~0.5 s, HA's frontend ~2 s). 30 s leaves room for waitMs (15 s at
# most) and a slow HA, and stays under the agent client's 40 s wait; the action's row in actions.py must exceed it.
CAPTURE_TIMEOUT: Final = 30.0
LAUNCH_ARGS: Final = (
    "--no-sandbox",  # the daemon may run as root in a container; the page is HA's own frontend, nothing else loads
    "--headless",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)
# Playwright's CSS engine pierces open shadow roots, so these find the cards inside HA's web components.
CARD_SELECTOR: Final = "hui-card, hui-entities-card, hui-gauge-card, hui-tile-card, hui-markdown-card, hui-error-card"
PANEL_OR_LOGIN: Final = "ha-panel-lovelace, ha-authorize"
SETTLE_MS: Final = 400  # icons and fonts arrive just after the cards; animations are disabled for the shot itself
NETWORK_IDLE_MS: Final = 5000
APPEAR_MS: Final = 15_000  # HA's frontend shows cards ~2 s after loading; a selector that never matches fails sooner
WIDTH_RANGE: Final = (320, 3840)
HEIGHT_RANGE: Final = (240, 2160)
ZOOM_RANGE: Final = (0.5, 3.0)
MAX_WAIT_MS: Final = 15_000
MAX_SELECTOR_CHARS: Final = 200
# CSS only: names, classes, ids, attributes, pseudo-classes, combinators. No backslash escapes, slashes, `@`, `{}`,
# `;` or `>>` (Playwright's selector chaining), so the string cannot reach another selector engine.
SELECTOR_RE: Final = re.compile(r"^[A-Za-z0-9 _.#:,>+~*\[\]=\"'()-]+$")
SCREENSHOTS_DIR: Final = "screenshots"
PARAMS: Final = frozenset({"dashboard", "view", "width", "height", "zoom", "waitMs", "selector"})
_NET_ERROR: Final = re.compile(r"net::ERR_[A-Z_]+")
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; upstream_error if the browser returned something else."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise FarmhostError("the browser did not return a PNG image", code=ErrorCode.UPSTREAM_ERROR)
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


# ------------------------------------------------------------------------------------------------ the browser


def _origin(url: str) -> str:
    """`scheme://host:port` with the default port spelled out; ws(s) counts as http(s)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:  # a malformed port never equals HA's
        return ""
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


def _init_script(origin: str, token: str, zoom: float) -> str:
    """Log the frontend in before its scripts run: the long-lived token as its stored `hassTokens`.

    `expires` is in 2100, so the frontend never tries to refresh (there is no refresh token).
    Only HA's own origin gets the token; every other request is aborted anyway.
    """
    tokens = {
        "hassUrl": origin,
        "clientId": f"{origin}/",
        "access_token": token,
        "token_type": "Bearer",
        "expires_in": 1800,
        "expires": 4102444800000,
        "refresh_token": "",
    }
    # Zoom as a browser's page zoom, set before the first layout so the dashboard's columns fit the zoomed width;
    # the PNG keeps the requested pixel size.
    zoom_js = f"document.addEventListener('DOMContentLoaded', () => {{ document.body.style.zoom = '{zoom:g}'; }});"
    return (
        f"if (window.location.origin === {json.dumps(origin)}) {{"
        f" window.localStorage.setItem('hassTokens', {json.dumps(json.dumps(tokens))});"
        f" {zoom_js if zoom != 1 else ''} }}"
    )


async def _take_shot(
    *, chromium: Path, base_url: str, token: str, shot: ShotParams, timeout: float
) -> tuple[bytes, int]:
    """Open HA's page for `shot` logged in, wait for its cards; return the viewport as PNG and the cards counted."""
    if not os.access(chromium, os.X_OK):
        raise Unavailable(
            f"Chromium is not installed at {chromium}; install Debian's chromium (apt-get install chromium)"
        )
    home = urlsplit(base_url)
    origin = f"{home.scheme}://{home.netloc}"
    deadline = time.monotonic() + timeout

    def left_ms() -> float:
        return max(1.0, (deadline - time.monotonic()) * 1000)

    async def only_ha(route: Route) -> None:
        if _origin(route.request.url) == _origin(origin):
            await route.fallback()
        else:
            await route.abort("blockedbyclient")

    async def refuse_socket(ws: WebSocketRoute) -> None:
        await ws.close()

    # Imported here: Playwright costs ~0.5 s at import, which every daemon start and CLI command would pay.
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        try:
            browser = await pw.chromium.launch(
                executable_path=str(chromium), headless=True, args=list(LAUNCH_ARGS), timeout=left_ms()
            )
        except PlaywrightError as err:
            raise Unavailable(f"Chromium at {chromium} did not start: {_first_line(err)}") from None
        try:
            context = await browser.new_context(
                viewport={"width": shot.width, "height": shot.height},
                service_workers="block",
                accept_downloads=False,
            )
            await context.route("**/*", only_ha)
            await context.route_web_socket(lambda url: _origin(url) != _origin(origin), refuse_socket)
            await context.add_init_script(_init_script(origin, token, shot.zoom))
            page = await context.new_page()
            return await _load_and_shoot(page, origin + shot.url_path, shot, left_ms)
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
            "Home Assistant showed its login page: it refused the configured token (HA_TOKEN)",
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


# ------------------------------------------------------------------------------------------------ the file


def open_screenshots_dir(workspace: Path) -> int:
    """Open (creating it) `screenshots/` in the workspace without following links; the caller closes the fd.

    Raises:
        NotFound: the workspace does not exist.
        NotAllowed: the workspace or `screenshots` is a symlink or not a directory.
    """
    try:
        ws_fd = os.open(workspace, _DIR_FLAGS)
    except FileNotFoundError:
        raise NotFound("the group's workspace does not exist") from None
    except OSError as err:
        raise NotAllowed(f"the group's workspace cannot be opened safely ({err.strerror})") from None
    try:
        with contextlib.suppress(FileExistsError):  # mkdir never follows a symlink at the last component
            os.mkdir(SCREENSHOTS_DIR, 0o755, dir_fd=ws_fd)
        try:
            return os.open(SCREENSHOTS_DIR, _DIR_FLAGS, dir_fd=ws_fd)
        except OSError as err:
            raise NotAllowed(
                f"{SCREENSHOTS_DIR}/ in the workspace is a symlink or not a directory ({err.strerror}); remove it"
            ) from None
    finally:
        os.close(ws_fd)


def write_png(dir_fd: int, name: str, data: bytes) -> None:
    """Write `name` atomically (temp + fsync + rename) inside the held directory.

    Raises:
        NotAllowed: something that is not a regular file already has that name.
    """
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise NotAllowed(f"{SCREENSHOTS_DIR}/{name} exists and is not a regular file; nothing was written")
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a directory entry, never a link target
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def _file_name(shot: ShotParams, ctx: RequestContext) -> str:
    """`<dashboard>[-<view>]-<UTC stamp>-<requestId>.png`: unique per request, readable, under NAME_MAX."""
    view = f"-{shot.view}" if shot.view else ""
    return f"{shot.dashboard}{view}-{ctx.now.astimezone(UTC):%Y%m%dT%H%M%SZ}-{ctx.request_id[:64]}.png"


async def capture(
    *, chromium: Path, base_url: str, token: str, workspace: Path, name: str, shot: ShotParams
) -> dict[str, Any]:
    """Take the picture and save it as `screenshots/<name>` in `workspace`; the action's result.

    Raises:
        Unavailable: Chromium is missing or does not start; HA does not answer.
        NotFound: HA has no such dashboard or view; the workspace is missing.
        NotAllowed: `screenshots/` or the file name is a link or not a directory / regular file.
        InvalidRequest: the selector is not CSS the browser accepts.
        FarmhostError: HA showed its login page (upstream_error); nothing appeared in time (timeout).
    """
    dir_fd = open_screenshots_dir(workspace)  # refuse a symlinked screenshots/ before spending seconds on a browser
    try:
        try:
            async with asyncio.timeout(CAPTURE_TIMEOUT):
                png, matched = await _take_shot(
                    chromium=chromium, base_url=base_url, token=token, shot=shot, timeout=CAPTURE_TIMEOUT
                )
        except TimeoutError:
            raise FarmhostError(
                f"the screenshot of {shot.url_path} took longer than {CAPTURE_TIMEOUT:g} s", code=ErrorCode.TIMEOUT
            ) from None
        width, height = _png_size(png)
        write_png(dir_fd, name, png)
    finally:
        os.close(dir_fd)
    return {
        "path": f"{SCREENSHOTS_DIR}/{name}",
        "width": width,
        "height": height,
        "bytes": len(png),
        "urlPath": shot.url_path,
        "matched": matched,
    }


async def ha_capture_screenshot(deps: FarmDeps, ctx: RequestContext, params: dict[str, Any]) -> dict[str, Any]:
    """The farm action: `{dashboard?, view?, width?, height?, zoom?, waitMs?, selector?}` -> the saved PNG.

    Returns:
        `{path (relative to the group's workspace), width, height, bytes, urlPath, matched}`.

    Raises:
        InvalidRequest, NotFound, NotAllowed, Unavailable, FarmhostError (timeout, upstream_error).
    """
    shot = parse_params(params)
    settings = deps.settings
    if not (settings.ha_url and settings.ha_token):
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    return await capture(
        chromium=CHROMIUM_PATH,
        base_url=settings.ha_url,
        token=settings.ha_token,
        workspace=ctx.layout.workspace(ctx.group.folder),
        name=_file_name(shot, ctx),
        shot=shot,
    )
