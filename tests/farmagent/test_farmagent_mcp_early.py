"""The handshake farmagent-mcp answers before the SDK is imported: the same answers as the SDK's, and a clean hand-over."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from agent_support import clean_env, fake_ipc_dir
from farmagent.config import AgentSettings
from farmagent.mcp_early import HANDSHAKE_VERSIONS, answer_until_ready
from farmagent.mcp_server import handshake, offered_tools
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS


def initialize(rid: int | str, version: str, **params: Any) -> dict[str, Any]:
    """An `initialize` request as MCP clients send it."""
    body = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
    return {"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": {**body, **params}}


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def lines(*messages: dict[str, Any]) -> bytes:
    """The messages as the wire carries them: one JSON document a line."""
    return b"".join(json.dumps(message).encode() + b"\n" for message in messages)


def server_env(ipc: Path) -> dict[str, str]:
    """The environment of a server for a non-main group with no daemon behind its IPC directory."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("FARMAGENT_")}
    return {**env, "FARMAGENT_IPC_DIR": str(ipc), "FARMAGENT_GROUP_DIR": str(ipc), "FARMAGENT_FARM_STATE_DIR": str(ipc)}


def exchange(env: dict[str, str], wire: bytes, answers: int) -> list[dict[str, Any]]:
    """Spawn the server, write `wire` at once, read `answers` responses (notifications are skipped), close."""
    with subprocess.Popen(
        [sys.executable, "-m", "farmagent.mcp_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as server:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(wire)
        server.stdin.flush()
        got: list[dict[str, Any]] = []
        while len(got) < answers:
            line = server.stdout.readline()
            assert line, f"the server closed stdout after {got}"
            message = json.loads(line)
            if "id" in message:
                got.append(message)
        server.stdin.close()
        assert server.stdout.read() == b"", "an answer came twice"
        assert server.wait(timeout=10) == 0
    return got


def early_answers(env: dict[str, str], wire: bytes, answers: int) -> tuple[list[dict[str, Any]], Any]:
    """Run the early responder on pipes, in this process, with the SDK 'still importing' until it answered."""
    settings = AgentSettings.from_env(env)
    client_in, server_in = os.pipe()
    server_out, client_out = os.pipe()
    ready_r, ready_w = os.pipe()
    outcome: list[Any] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            answer_until_ready(client_in, client_out, ready_r, handshake(offered_tools(settings)))
        )
    )
    worker.start()
    os.write(server_in, wire)
    with os.fdopen(server_out, "rb") as out:
        got = [json.loads(out.readline()) for _ in range(answers)]
        # Every byte read (and so handled: the responder handles a chunk before it looks at `ready` again).
        while unread(client_in):
            time.sleep(0.001)
        os.write(ready_w, b"!")
        worker.join(timeout=10)
    for fd in (client_in, server_in, client_out, ready_r, ready_w):
        os.close(fd)
    (early,) = outcome
    return got, early


def unread(fd: int) -> int:
    """Bytes waiting in the pipe `fd` reads."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def test_the_early_revisions_are_the_sdks_handshake_revisions() -> None:
    assert HANDSHAKE_VERSIONS == HANDSHAKE_PROTOCOL_VERSIONS


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_the_early_handshake_answers_as_the_sdk_does(tmp_path: Path, version: str) -> None:
    env = server_env(fake_ipc_dir(tmp_path / "ipc"))
    wire = lines(initialize(1, version), INITIALIZED, TOOLS_LIST)
    early, state = early_answers(env, wire, 2)
    # The SDK answers everything after a request the early phase leaves to it (a ping, before the handshake).
    ping = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    pong, *sdk = exchange(env, lines(ping, initialize(1, version), INITIALIZED, TOOLS_LIST), 3)
    assert pong == {"jsonrpc": "2.0", "id": 0, "result": {}}
    assert early == sdk
    assert early[0]["result"]["protocolVersion"] == version and early[1]["result"]["tools"]
    # The SDK sees the handshake itself (not the listing, answered already) and must not answer it twice.
    assert state.replay == lines(initialize(1, version), INITIALIZED) and state.drop_ids == {1}


def test_requests_during_the_early_phase_are_answered_once_each(tmp_path: Path) -> None:
    # Written at once, before the SDK is imported: the call waits for the SDK, the handshake does not.
    call = {"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "ping", "arguments": {}}}
    wire = lines(initialize("i", "2025-06-18"), INITIALIZED, TOOLS_LIST, call, TOOLS_LIST | {"id": 4})
    ipc = tmp_path / "ipc"
    for queue in ("messages", "tasks", "actions", "action_results"):
        (ipc / queue).mkdir(parents=True)
    answers = {message["id"]: message for message in exchange(server_env(ipc), wire, 4)}
    assert set(answers) == {"i", 2, "c", 4}
    assert answers[2]["result"] == answers[4]["result"]
    # No host ever served this directory: the call is a tool error the model can read, not a broken session.
    assert answers["c"]["result"]["isError"] is True
    assert json.loads(answers["c"]["result"]["content"][0]["text"])["errorCode"] == "host_unavailable"


@pytest.mark.parametrize(
    "first",
    [
        initialize(1, "2099-01-01"),  # a revision the handshake does not know: the SDK counter-offers
        initialize(1, "2025-06-18", _meta={"progressToken": "p"}),
        initialize(1, "2025-06-18", clientInfo={"name": "test"}),  # no version: the SDK decides
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}},
    ],
)
def test_anything_but_the_plain_handshake_is_left_to_the_sdk(tmp_path: Path, first: dict[str, Any]) -> None:
    env = server_env(fake_ipc_dir(tmp_path / "ipc"))
    early, state = early_answers(env, lines(first, TOOLS_LIST), 0)
    assert early == [] and state.replay == lines(first, TOOLS_LIST) and not state.drop_ids
    (answer,) = exchange(env, lines(first), 1)
    assert answer["id"] == 1 and ("result" in answer or "error" in answer)
