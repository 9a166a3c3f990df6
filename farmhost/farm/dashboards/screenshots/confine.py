"""The screenshot browser's confinement: it can only look at Home Assistant, never act or talk elsewhere.

Installed on the browser context before the page exists:
- every request goes through one route: another origin, a method other than GET/HEAD, or an answer that is a
  redirect (fetched here with `max_redirects=0`, since the browser would follow redirect hops without asking
  the route again) is aborted; the rest is fulfilled with the answer fetched (HA's static frontend files,
  which HA never answers with a redirect, go to the browser's own network stack);
- every WebSocket is routed: another origin or path is closed, HA's `/api/websocket` is proxied and each
  page -> HA message passes ws_filter.py (read commands only, the screenshot user's token in `auth`);
- any page besides the one photographed (a popup, `window.open`) is closed, downloads are refused, service
  workers blocked; WebRTC is off twice: Chromium's UDP is disabled by a launch flag (no STUN packet leaves)
  and `RTCPeerConnection` is removed from every frame's globals;
- the frontend's login (`hassTokens` in localStorage), only in HA's own origin.
Each blocked thing is logged once, as its origin only (never a path or query: a token could be in them).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Final
from urllib.parse import urljoin, urlsplit

from farmhost.farm.dashboards.screenshots.ws_filter import filter_from_page

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Download, Page, Route, WebSocketRoute

log = logging.getLogger(__name__)

# Measured with Chromium 156 and a UDP listener as STUN server: with this flag none arrive; without it, or with
# `--force-webrtc-ip-handling-policy=...` instead (this build ignores it), 4 STUN packets do.
WEBRTC_FLAGS: Final = ("--webrtc-ip-handling-policy=disable_non_proxied_udp",)
MAX_LOGGED: Final = 40  # blocked things logged per capture; a page that loops on them must not flood the log
READ_METHODS: Final = frozenset({"GET", "HEAD"})
# HA's frontend bundle, served by HA's own static-file handlers, which answer a file or an error and never a
# redirect: these GETs go straight to the browser's network stack. Everything else of HA's origin (the page,
# /api/, /local/, integrations' views) is fetched here first, because Playwright's route fetch costs ~10 ms a
# request and ~1 s each when the frontend loads its ~100 chunks at once.
STATIC_PREFIXES: Final = ("/frontend_latest/", "/frontend_es5/", "/static/")
WS_PATH: Final = "/api/websocket"
# Before any page script, in every frame: WebRTC's constructors are gone (the launch flag already keeps UDP off).
NO_WEBRTC_JS: Final = (
    "for (const name of ['RTCPeerConnection', 'webkitRTCPeerConnection', 'RTCDataChannel', 'RTCIceCandidate']) {"
    " try { delete window[name]; } catch (e) {} }"
)


def origin_of(url: str) -> str:
    """`scheme://host:port` with the default port spelled out; ws(s) counts as http(s); "" when unreadable."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:  # a malformed port never equals HA's
        return ""
    if scheme not in ("http", "https") or not parts.hostname:
        return f"{scheme}:" if scheme else ""
    return f"{scheme}://{parts.hostname.lower()}:{port}"


def login_script(origin: str, token: str) -> str:
    """Log the frontend in before its scripts run: the token as its stored `hassTokens`, in HA's origin only.

    `expires` is in 2100, so the frontend never tries to refresh (there is no refresh token).
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
    return (
        f"if (window.location.origin === {json.dumps(origin)}) {{"
        f" window.localStorage.setItem('hassTokens', {json.dumps(json.dumps(tokens))}); }}"
    )


class Confinement:
    """One capture's rules for its browser context: HA's origin (`base_url`), the token the socket presents."""

    def __init__(self, base_url: str, token: str) -> None:
        home = urlsplit(base_url)
        self.base = f"{home.scheme}://{home.netloc}"
        self.origin = origin_of(self.base)
        self._token = token
        self._logged = 0
        self.main: Page | None = None

    async def install(self, context: BrowserContext) -> None:
        """Routes, socket proxy, scripts and page watch on `context` (before its first page)."""
        await context.route("**/*", self._request)
        await context.route_web_socket(lambda _url: True, self._socket)
        await context.add_init_script(NO_WEBRTC_JS)
        await context.add_init_script(login_script(self.base, self._token))
        context.on("page", self._page)

    def blocked(self, what: str, url: str) -> None:
        """Log one blocked thing: what, and the origin it was for (never the rest of the URL)."""
        self._logged += 1
        if self._logged <= MAX_LOGGED:
            log.warning("screenshot browser blocked %s to %s", what, origin_of(url) or "(no origin)")
        elif self._logged == MAX_LOGGED + 1:
            log.warning("screenshot browser blocked more than %d things; no more are logged", MAX_LOGGED)

    async def _request(self, route: Route) -> None:
        from playwright.async_api import Error as PlaywrightError

        request = route.request
        if origin_of(request.url) != self.origin:
            self.blocked(f"a {request.resource_type} request", request.url)
            await route.abort("blockedbyclient")
            return
        if request.method not in READ_METHODS:
            self.blocked(f"a {request.method} request", request.url)
            await route.abort("blockedbyclient")
            return
        if urlsplit(request.url).path.startswith(STATIC_PREFIXES):
            await route.fallback()
            return
        try:
            response = await route.fetch(max_redirects=0)
        except PlaywrightError:  # HA refused the connection or went away: the browser sees the same
            await route.abort("connectionrefused")
            return
        if 300 <= response.status < 400:
            target = urljoin(request.url, response.headers.get("location", ""))
            self.blocked(f"a redirect ({response.status}) of a {request.resource_type} request", target)
            await route.abort("blockedbyclient")
            return
        await route.fulfill(response=response)

    async def _socket(self, ws: WebSocketRoute) -> None:
        if origin_of(ws.url) != self.origin or urlsplit(ws.url).path != WS_PATH:
            self.blocked("a WebSocket", ws.url)
            await ws.close()
            return
        server = ws.connect_to_server()

        def from_page(frame: str | bytes) -> None:
            out = filter_from_page(frame, token=self._token)
            for kind in out.refused:
                self.blocked(f"the WebSocket command {kind!r}", ws.url)
            for answer in out.answers:
                ws.send(answer)
            if out.forward is not None:
                server.send(out.forward)

        ws.on_message(from_page)

    async def _page(self, page: Page) -> None:
        if self.main is None:
            self.main = page
            page.on("download", self._download)
            return
        self.blocked("a popup", page.url)
        await page.close()

    def _download(self, download: Download) -> None:
        self.blocked("a download", download.url)
