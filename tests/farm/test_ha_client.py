"""HAClient against the real Home Assistant: calls, HA's refusals as typed errors, bad token, HA down, hung and back."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, clean_env, drop, scaled, wait_result
from ha_core_support import farm_host, make_data_dir
from ha_fixture import HaInstance

from farmhost.farm.homeassistant.client import (
    REQUEST_TIMEOUT,
    HaAuthFailed,
    HAClient,
    HaError,
    HaNotFound,
    HaRejected,
    HaTimeout,
    HaUnavailable,
)
from farmhost.protocol.codes import ErrorCode

LOGGER = "farmhost.farm.homeassistant.client"


@pytest.fixture
async def client(ha_reset: HaInstance) -> AsyncIterator[HAClient]:
    async with HAClient(url=ha_reset.url, token=ha_reset.token) as ha_client:
        yield ha_client


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_reads_writes_and_websocket(client: HAClient, ha: HaInstance, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ha.token not in repr(client) and ha.url in repr(client)
    assert (await client.get_config())["state"] == "RUNNING" and await client.is_running()
    looks: list[str] = []
    get_config = client.get_config

    async def counted() -> dict[str, Any]:
        looks.append("GET /api/config")
        return await get_config()

    monkeypatch.setattr(client, "get_config", counted)
    await client.wait_running(timeout=scaled(5))
    assert len(looks) == 1  # running already: one look, no polling
    monkeypatch.undo()
    states = {s["entity_id"]: s for s in await client.get_states()}
    assert states["sensor.air_temperature"]["state"] == "14.5"
    assert (await client.get_state("switch.irrigation_pump"))["state"] == "off"

    changed = await client.call_service("switch", "turn_on", {}, target={"entity_id": "switch.irrigation_pump"})
    assert {s["entity_id"]: s["state"] for s in changed} == {
        "switch.irrigation_pump": "on",
        "input_boolean.pump_relay": "on",
    }
    assert ha.get_state("input_boolean.pump_relay")["state"] == "on"

    dashboards = await client.ws_command("lovelace/dashboards/list")
    assert "farm-yaml" in {d["url_path"] for d in dashboards}
    assert (await client.ws_command("get_config"))["state"] == "RUNNING"


ERRORS: list[tuple[str, Callable[[HAClient], Awaitable[Any]], type[HaError], ErrorCode, str]] = [
    ("unknown entity", lambda c: c.get_state("sensor.no_such_probe"), HaNotFound, ErrorCode.NOT_FOUND, "sensor.no_such_probe"),
    ("unknown service", lambda c: c.call_service("switch", "explode", {}), HaNotFound, ErrorCode.NOT_FOUND, "switch.explode"),
    (
        "out of range",
        lambda c: c.call_service("input_number", "set_value", {"entity_id": "input_number.air_humidity_raw", "value": 101}),
        HaRejected,
        ErrorCode.UPSTREAM_ERROR,
        "range 0.0 - 100.0",
    ),
    (  # HA's refusal carries numbers in its translation placeholders, which the library's model cannot read
        "number below its min",
        lambda c: c.call_service("number", "set_value", {"entity_id": "number.irrigation_duration", "value": -5}),
        HaRejected,
        ErrorCode.UPSTREAM_ERROR,
        "-5.0 for number.irrigation_duration is outside valid range 0.0 - 240.0",
    ),
    ("extra field", lambda c: c.call_service("switch", "turn_on", {"colour": "red"}), HaRejected, ErrorCode.UPSTREAM_ERROR, "colour"),
    ("unknown command", lambda c: c.ws_command("no_such/command"), HaRejected, ErrorCode.UPSTREAM_ERROR, "Unknown command"),
    ("no dashboard config", lambda c: c.ws_command("lovelace/config", url_path="no-such-board"), HaNotFound, ErrorCode.NOT_FOUND, "lovelace/config"),
    ("traversal", lambda c: c.get_state("../config"), HaRejected, ErrorCode.UPSTREAM_ERROR, "not a valid entity id"),
    ("no such path", lambda c: c.get_state("sensor.x/../../config"), HaRejected, ErrorCode.UPSTREAM_ERROR, "not a valid"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "call", "error", "code", "words"), ERRORS, ids=[e[0] for e in ERRORS])
async def test_refusals_are_typed(
    client: HAClient,
    what: str,
    call: Callable[[HAClient], Awaitable[Any]],
    error: type[HaError],
    code: ErrorCode,
    words: str,
) -> None:
    with pytest.raises(error) as caught:
        await call(client)
    assert type(caught.value) is error and caught.value.code is code
    assert words in caught.value.message
    # the socket and the session survive a refusal
    assert (await client.get_state("switch.irrigation_pump"))["state"] == "off"
    assert await client.ws_command("lovelace/dashboards/list")


async def test_bad_token(ha: HaInstance, caplog: pytest.LogCaptureFixture) -> None:
    token = "not-" + ha.token[:20]
    async with HAClient(url=ha.url, token=token) as bad:
        for call in (bad.get_states(), bad.ws_command("lovelace/dashboards/list"), bad.get_config()):
            with pytest.raises(HaAuthFailed) as caught:
                await call
            assert caught.value.code is ErrorCode.UPSTREAM_ERROR
            assert "refused the host's access token" in caught.value.message and "HA_TOKEN" in caught.value.message
            assert token not in caught.value.message
    refusals = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(refusals) == 1, "a refused token is logged once, not at every call"
    assert token not in caplog.text


async def test_nothing_listening(caplog: pytest.LogCaptureFixture) -> None:
    # A refused connection fails at once: all three calls together take less than one request timeout.
    request_timeout = 30.0
    async with HAClient(
        url=f"http://127.0.0.1:{_closed_port()}", token="t", request_timeout=request_timeout
    ) as nowhere:
        started = time.monotonic()
        for call in (nowhere.get_states(), nowhere.ws_command("get_config"), nowhere.restart(timeout=request_timeout)):
            with pytest.raises(HaUnavailable, match="connection refused") as caught:
                await call
            assert caught.value.code is ErrorCode.UPSTREAM_UNAVAILABLE
        assert time.monotonic() - started < request_timeout
        assert not await nowhere.is_running()
        with pytest.raises(HaTimeout, match="not RUNNING within 0.5 s"):
            await nowhere.wait_running(timeout=0.5)
    async with HAClient(url="http://no-such-host.invalid:8123", token="t", request_timeout=2) as unknown:
        with pytest.raises(HaUnavailable, match="not resolved"):
            await unknown.get_config()
    assert len([r for r in caplog.records if r.name == LOGGER and "unreachable" in r.getMessage()]) == 2


async def test_home_assistant_hung(tmp_path: Path, ha_reset: HaInstance) -> None:
    async with farm_host(make_data_dir(tmp_path / "data"), ha_env=ha_reset.env(), request_timeout=1.0) as host:
        assert host.ha is not None
        status = {"entityIds": ["switch.irrigation_pump"]}
        assert (await host.ask("main", "ha_get_status", status))["status"] == "success"
        assert await host.ha.ws_command("lovelace/dashboards/list")
        pid = ha_reset.hass_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # HA accepts connections (the kernel does) and never answers
        try:
            started = time.monotonic()
            hung = await host.ask("main", "ha_get_status", status)
            assert hung["errorCode"] == "timeout" and "within 1 s" in hung["error"], hung
            assert (await host.ping("field"))["status"] == "success"
            assert (await host.ping("main"))["status"] == "success"
            with pytest.raises(HaTimeout):
                await host.ha.ws_command("lovelace/dashboards/list")
            assert time.monotonic() - started < scaled(5)  # each waited its 1 s timeout, the pings nothing
        finally:
            os.kill(pid, signal.SIGCONT)
        # Back: once HA answers again (it may take a while to catch up on a loaded machine, and every call here has
        # the 1 s timeout), the same host's calls succeed again.
        await host.ha.wait_running(timeout=scaled(30))
        on = {"entityId": "switch.irrigation_pump", "value": "on"}
        assert (await host.ask("main", "ha_set_entity", on))["result"]["confirmed"] is True
        assert await host.ha.ws_command("lovelace/dashboards/list")
        assert [line["errorCode"] for line in host.audit()] == [None, "timeout", None]
    ha_reset.reset()


# the real daemon -----------------------------------------------------------------------------------------


def ask(data_dir: Path, folder: str, action: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Drop a farm_action like an agent and wait for its result from the daemon."""
    rid = f"{action}-{secrets.token_hex(4)}"
    drop(
        data_dir, folder, "actions", {"type": "farm_action", "action": action, "requestId": rid, "params": params or {}}
    )
    return wait_result(data_dir, folder, rid, timeout=20)


def ping(data_dir: Path, folder: str) -> dict[str, Any]:
    rid = f"ping-{secrets.token_hex(4)}"
    drop(data_dir, folder, "actions", {"type": "ping", "requestId": rid})
    return wait_result(data_dir, folder, rid)


def assert_token_nowhere(data_dir: Path, token: str, daemon: Daemon) -> None:
    """The HA token is in no file of the data dir (ipc/, groups/, farm-state/, the database...) nor in the log."""
    files = [p for p in data_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.parent.name == "action_results" for p in files)
    for path in files:
        assert token.encode() not in path.read_bytes(), path
    assert token not in daemon.log()


@pytest.mark.slow
def test_daemon_home_assistant_down_and_back(tmp_path: Path, ha_reset: HaInstance) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    daemon = Daemon(data_dir, env=clean_env(**ha_reset.env())).start()
    try:
        status = {"entityIds": ["switch.irrigation_pump"]}
        assert ask(data_dir, "main", "ha_get_status", status)["status"] == "success"
        ha_reset.take_down()
        for action, params in (
            ("ha_get_status", status),
            ("ha_set_entity", {"entityId": "switch.irrigation_pump", "value": "on"}),
            ("ha_call_service", {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.irrigation_pump"}}),
        ):  # fmt: skip
            down = ask(data_dir, "main", action, params)
            assert down["errorCode"] == "upstream_unavailable" and "unreachable" in down["error"], down
            # refused at once, not given up on after the request timeout (however long the machine takes)
            assert "connection refused" in down["error"], down
            assert down["durationMs"] < REQUEST_TIMEOUT * 1000, down
        assert ping(data_dir, "field")["status"] == "success"
        assert ping(data_dir, "main")["status"] == "success"

        ha_reset.start()  # the same farmhost process carries on: REST and the WebSocket reconnect
        on = ask(data_dir, "main", "ha_set_entity", {"entityId": "switch.irrigation_pump", "value": "on"})
        assert on["status"] == "success" and on["result"]["state"]["state"] == "on", on
        assert ask(data_dir, "main", "ha_get_status", status)["result"]["states"][0]["state"] == "on"
        audit = [json.loads(line) for line in (data_dir / "farm-state" / "audit.ndjson").read_text().splitlines()]
        assert [r["errorCode"] for r in audit] == [None, *["upstream_unavailable"] * 3, None, None]
    finally:
        assert daemon.stop() == 0, daemon.log()
    log = daemon.log()
    # The link's own warnings, once each. (Other lines may quote the error: the state collector's first refresh
    # can still be running when HA stops on a busy machine, and it logs what it could not fetch.)
    link = [line for line in log.splitlines() if "farmhost.farm.homeassistant.client:" in line]
    assert sum("is unreachable" in line for line in link) == 1, log
    assert sum("is reachable again" in line for line in link) == 1, log
    assert "Traceback" not in log, log
    assert_token_nowhere(data_dir, ha_reset.farmhost_token, daemon)
    ha_reset.reset()


def test_daemon_bad_token(tmp_path: Path, ha: HaInstance) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    token = "bad" + ha.token[3:]  # well-formed, signed with the wrong key as far as HA can tell
    daemon = Daemon(data_dir, env=clean_env(HA_URL=ha.url, HA_TOKEN=token)).start()
    try:
        for action, params in (
            ("ha_get_status", {}),
            ("ha_set_entity", {"entityId": "switch.irrigation_pump", "value": "on"}),
        ):
            refused = ask(data_dir, "main", action, params)
            assert refused["errorCode"] == "upstream_error", refused
            assert "refused the host's access token" in refused["error"] and "HA_TOKEN" in refused["error"]
        assert ping(data_dir, "field")["status"] == "success"
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert daemon.log().count("refused farmhost's token") == 1, daemon.log()
    assert_token_nowhere(data_dir, token, daemon)
