"""A local stand-in for Home Assistant's Supervisor, as an add-on sees it at http://supervisor: a real HTTP server.

It speaks the routes farmhost's add-on uses, as supervisor/api/__init__.py, proxy.py and services.py define them:

- `/core/api/{path}` (GET, POST, DELETE) and `/core/api/`: the add-on's `Authorization: Bearer <SUPERVISOR_TOKEN>`
  is checked, then the request goes to the test Home Assistant with the Supervisor's own token instead;
- `/core/api/websocket` and `/core/websocket`: `auth_required`, the add-on's `auth` with its SUPERVISOR_TOKEN
  (`access_token` or `api_password`), `auth_ok` (or `auth_invalid`), then every message both ways to and from a
  WebSocket the stand-in opened to Home Assistant and authenticated with its own token; `supervisor/` and `hassio/`
  commands are refused as the Supervisor refuses them;
- GET `/services/mqtt`: `{"result": "ok", "data": {host, port, ssl, protocol, username, password, addon}}` for the
  broker it was given, `{"result": "error", "message": "Service not enabled"}` (400) without one; 401 for a wrong
  token, as the Supervisor's security middleware answers.

Every request is recorded (method, path, whether its token was the add-on's), so a test can see which route ran.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

DENIED_WS_TYPE_PREFIXES = ("supervisor/", "hassio/")


@dataclass
class MqttGrant:
    """What GET /services/mqtt answers: the Mosquitto add-on's broker and a login for the asking add-on."""

    host: str
    port: int
    username: str
    password: str
    ssl: bool = False


@dataclass
class SupervisorStub:
    """The stand-in's state: the add-on's token, Home Assistant behind it, the broker it hands out."""

    token: str
    ha_url: str
    ha_token: str
    mqtt: MqttGrant | None = None
    seen: list[tuple[str, str, bool]] = field(default_factory=list)
    url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, request: web.Request, token_ok: bool) -> None:
        with self._lock:
            self.seen.append((request.method, request.path, token_ok))

    def requests(self) -> list[tuple[str, str, bool]]:
        """(method, path, the add-on's token was right) of every request so far."""
        with self._lock:
            return list(self.seen)

    def _bearer_ok(self, request: web.Request) -> bool:
        bearer = request.headers.get("Authorization", "").split(" ")[-1]
        return (bearer or request.headers.get("X-Ha-Access", "")) == self.token

    async def services_mqtt(self, request: web.Request) -> web.Response:
        ok = self._bearer_ok(request)
        self._record(request, ok)
        if not ok:
            return web.json_response({"result": "error", "message": "Unauthorized"}, status=401)
        if self.mqtt is None:
            return web.json_response({"result": "error", "message": "Service not enabled"}, status=400)
        grant = self.mqtt
        data = {"addon": "core_mosquitto", "host": grant.host, "port": grant.port, "ssl": grant.ssl,
                "protocol": "3.1.1", "username": grant.username, "password": grant.password}  # fmt: skip
        return web.json_response({"result": "ok", "data": data})

    async def core_api(self, request: web.Request) -> web.StreamResponse:
        ok = self._bearer_ok(request)
        self._record(request, ok)
        if not ok:
            raise web.HTTPUnauthorized
        path = request.match_info.get("path", "")
        if path.startswith(("hassio/", "hassio_")):
            raise web.HTTPForbidden
        headers = {"Authorization": f"Bearer {self.ha_token}"}
        if "Content-Type" in request.headers:
            headers["Content-Type"] = request.headers["Content-Type"]
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method, f"{self.ha_url}/api/{path}", headers=headers, params=request.query, data=body or None
            ) as upstream,
        ):
            data = await upstream.read()
            return web.Response(body=data, status=upstream.status, content_type=upstream.content_type)

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        server = web.WebSocketResponse(heartbeat=30)
        await server.prepare(request)
        await server.send_json({"type": "auth_required", "ha_version": "stub"})
        try:
            auth = await server.receive_json(timeout=10)
        except (TimeoutError, ValueError, TypeError):
            self._record(request, False)
            return server
        token_ok = (auth.get("access_token") or auth.get("api_password")) == self.token
        self._record(request, token_ok)
        if not token_ok:
            await server.send_json({"type": "auth_invalid", "message": "Invalid access"})
            await server.close()
            return server
        ws_url = self.ha_url.replace("http://", "ws://", 1) + "/api/websocket"
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as client:
            await client.receive_json()  # auth_required
            await client.send_json({"type": "auth", "access_token": self.ha_token})
            answer = await client.receive_json()
            if answer.get("type") != "auth_ok":
                await server.close()
                return server
            await server.send_json({"type": "auth_ok", "ha_version": answer.get("ha_version", "stub")})
            await asyncio.gather(_pipe(client, server, filtered=False), _pipe(server, client, filtered=True))
        return server


async def _pipe(source: Any, target: Any, *, filtered: bool) -> None:
    """Messages from `source` to `target` until either closes; from the add-on, denied command types answered."""
    async for msg in source:
        if msg.type == WSMsgType.TEXT:
            if filtered:
                try:
                    parsed = json.loads(msg.data)
                    kind = parsed.get("type", "") if isinstance(parsed, dict) else ""
                except ValueError:
                    kind = ""
                if isinstance(kind, str) and kind.startswith(DENIED_WS_TYPE_PREFIXES):
                    error = {"code": "unauthorized", "message": "Unauthorized"}
                    await source.send_json({"id": parsed.get("id"), "type": "result", "success": False, "error": error})
                    continue
            await target.send_str(msg.data)
        elif msg.type == WSMsgType.BINARY:
            await target.send_bytes(msg.data)
        else:
            break
    await target.close()


@contextmanager
def running_supervisor(stub: SupervisorStub, host: str = "127.0.0.1") -> Iterator[SupervisorStub]:
    """Serve `stub` on `host` and a free port in a thread of its own; `stub.url` is its root."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.add_routes(
        [
            web.get("/services/mqtt", stub.services_mqtt),
            web.get("/core/api/websocket", stub.websocket),
            web.get("/core/websocket", stub.websocket),
            web.post("/core/api/{path:.+}", stub.core_api),
            web.get("/core/api/{path:.+}", stub.core_api),
            web.delete("/core/api/{path:.+}", stub.core_api),
            web.get("/core/api/", stub.core_api),
        ]
    )
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, host, 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    stub.url = f"http://{host}:{port}"
    thread = threading.Thread(target=loop.run_forever, name="supervisor-stub", daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
