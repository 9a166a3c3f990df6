"""The live view keeps reconnecting when Home Assistant closes the socket in the middle of its handshake.

HA closes its WebSocket while it stops or restarts, also between `auth_required` and the answer to the token
(a fresh-clone CI run met it during a test's HA restart): aiohttp's `receive_json` raises a TypeError for that close
frame, which used to end the live view's task for good (no more events, so no effect rules) and make the daemon's
stop exit 1. A real WebSocket server on 127.0.0.1 speaks HA's handshake and breaks it three ways before it lets the
fourth connection through.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import WSMsgType, web

from farmhost.farm.homeassistant.live_view import LiveView

STATES = [{"entity_id": "switch.pump", "state": "off", "attributes": {}, "context": {"id": "c1"}}]


class BrokenHandshakes:
    """HA's WebSocket API, whose first connections break: closed after the token, a non-JSON frame, a JSON list."""

    def __init__(self) -> None:
        self.connections = 0

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.connections += 1
        await ws.send_json({"type": "auth_required"})
        await ws.receive()  # the token
        if self.connections == 1:
            await ws.close()  # HA stopping: a close frame where auth_ok was due
            return ws
        if self.connections == 2:
            await ws.send_str("{not json")
            return ws
        if self.connections == 3:
            await ws.send_json(["auth_ok"])
            return ws
        await ws.send_json({"type": "auth_ok"})
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                break
            command = json.loads(message.data)
            answers: dict[str, object] = {"auth/current_user": {"id": "u1", "is_owner": True}, "get_states": STATES}
            result = answers.get(command["type"])
            await ws.send_json({"id": command["id"], "type": "result", "success": True, "result": result})
        return ws


@pytest_asyncio.fixture
async def broken_ha() -> AsyncIterator[tuple[BrokenHandshakes, str]]:
    fake = BrokenHandshakes()
    app = web.Application()
    app.router.add_get("/api/websocket", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"ws://127.0.0.1:{port}/api/websocket"
    await runner.cleanup()


async def test_a_handshake_broken_by_a_close_or_a_bad_frame_is_a_lost_connection_not_the_end(
    broken_ha: tuple[BrokenHandshakes, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = broken_ha
    caplog.set_level(logging.WARNING, logger="farmhost.farm.homeassistant.live_view")
    view = LiveView(ws_url=url, token="t", backoff_first=0.01, backoff_max=0.05)
    await view.start()
    try:
        assert await view.wait_synced(timeout=20), caplog.text
        assert fake.connections == 4  # each broken handshake was followed by another try
        assert view.get("switch.pump") is not None
    finally:
        await view.stop()  # returns: nothing escaped the task
    # The outage is told once, with its first cause, until the view follows again.
    assert "event stream is lost (_Broken: Home Assistant closed the connection (CLOSE))" in caplog.text, caplog.text
