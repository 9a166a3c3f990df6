"""The screenshot browser's second wall: with no route at all, Chromium still reaches only Home Assistant's port.

confine.py's route examines every request; a request it had paused when a capture ended early once went out
unexamined as Playwright let go of the browser (a CI run saw it reach another origin). Chromium is now launched
with a proxy nobody serves for everything but HA's own host and port. Real Chromium, real HTTP servers on
127.0.0.1 (the loopback case is the hard one: Chromium never proxies loopback unless told).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import async_playwright

from farmhost.farm.dashboards.screenshots.browser import CHROMIUM_PATH, launch_args


class Site:
    """A real HTTP server on 127.0.0.1 that records the paths asked of it."""

    def __init__(self, page: str) -> None:
        self.paths: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.paths.append(self.path)
                body = page.encode() if self.path == "/" else b"// nothing"
                self.send_response(200)
                self.send_header("content-type", "text/html" if self.path == "/" else "text/javascript")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sites() -> Iterator[tuple[Site, Site]]:
    other = Site("<html>another origin</html>")
    home = Site(f'<html><script src="/app.js"></script><img src="{other.url}/leak.gif?secret=1"></html>')
    yield home, other
    home.close()
    other.close()


async def test_without_any_route_chromium_reaches_home_assistants_port_and_nothing_else(
    sites: tuple[Site, Site],
) -> None:
    home, other = sites
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM_PATH), headless=True, args=launch_args(home.url)
        )
        try:
            page = await browser.new_page()
            await page.goto(home.url + "/", wait_until="load")
            with pytest.raises(PlaywrightError, match="ERR_PROXY_CONNECTION_FAILED"):
                await page.goto(other.url + "/direct")
        finally:
            await browser.close()
    assert home.paths[:2] == ["/", "/app.js"], home.paths  # HA's page and its scripts load directly
    assert other.paths == [], other.paths  # the image and a navigation to another port of loopback never left
