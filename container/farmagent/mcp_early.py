"""The MCP handshake answered while the SDK is still being imported.

Importing the `mcp` SDK takes about 0.4 s (pydantic models of every protocol revision), most of
`farmagent-mcp`'s start-up. A client's first two requests, `initialize` and `tools/list`, need none of it: their
answers are fixed by this server's name, version, instructions and tools. `answer_until_ready` reads the wire
while another thread imports the SDK and answers exactly those two requests, in their plain form, the way the
SDK would (tests/farmagent/test_farmagent_mcp.py compares both answers for every handshake revision). Anything
else - another method, a revision the handshake does not know, a `_meta` envelope, params the SDK would refuse -
ends the early phase and waits for the SDK, which then reads everything from that point.

The SDK still sees the `initialize` request (replayed ahead of the wire) so that its session is in the state the
client believes; its second answer to that request is dropped (`Early.drop_ids`).
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

# The revisions the SDK negotiates through `initialize` (mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS; a test
# keeps the two equal). A client asking for another one is left to the SDK.
HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


@dataclass(frozen=True)
class Handshake:
    """What the early answers say: `initialize`'s result without `protocolVersion`, and the tool listing."""

    initialize: Mapping[str, Any]
    tools: Sequence[Mapping[str, Any]]


@dataclass
class Early:
    """What the SDK must see first: the bytes read from the wire to replay, and the answers it must not repeat."""

    replay: bytes = b""
    drop_ids: set[int | str] = field(default_factory=set)


def _request_id(message: Mapping[str, Any]) -> int | str | None:
    rid = message.get("id")
    if isinstance(rid, bool) or not isinstance(rid, int | str):
        return None
    return rid


def _plain_initialize(message: Mapping[str, Any]) -> str | None:
    """The requested revision when `message` is an `initialize` the handshake answers as is; None otherwise."""
    params = message.get("params")
    if not isinstance(params, dict) or "_meta" in params:
        return None
    info = params.get("clientInfo")
    version = params.get("protocolVersion")
    if not (isinstance(params.get("capabilities"), dict) and isinstance(info, dict)):
        return None
    if not (isinstance(info.get("name"), str) and isinstance(info.get("version"), str)):
        return None
    return version if version in HANDSHAKE_VERSIONS else None


class _Responder:
    def __init__(self, wire_out: int, handshake: Handshake) -> None:
        self.wire_out = wire_out
        self.handshake = handshake
        self.answering = True
        self.initialized = False
        self.early = Early()
        self._replay: list[bytes] = []

    def line(self, raw: bytes) -> None:
        """Answer `raw` or keep it for the SDK."""
        if self.answering and self._answered(raw):
            return
        self.answering = False
        self._replay.append(raw)

    def _answered(self, raw: bytes) -> bool:
        try:
            message = json.loads(raw)
        except ValueError:
            return False
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return False
        method = message.get("method")
        rid = _request_id(message)
        if method == "initialize" and rid is not None and not self.initialized:
            version = _plain_initialize(message)
            if version is None:
                return False
            self._send(rid, {**self.handshake.initialize, "protocolVersion": version})
            self.initialized = True
            self._replay.append(raw)  # the SDK's session must go through the handshake too
            self.early.drop_ids.add(rid)
            return True
        if method == "notifications/initialized" and "id" not in message and self.initialized:
            self._replay.append(raw)
            return True
        if method == "tools/list" and rid is not None and self.initialized and message.get("params") in (None, {}):
            self._send(rid, {"tools": list(self.handshake.tools)})
            return True
        return False

    def _send(self, rid: int | str, result: Mapping[str, Any]) -> None:
        data = json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}, ensure_ascii=False, separators=(",", ":"))
        view = memoryview((data + "\n").encode("utf-8"))
        while view:
            view = view[os.write(self.wire_out, view) :]

    def finish(self, rest: bytes) -> Early:
        self.early.replay = b"".join(self._replay) + rest
        return self.early


def answer_until_ready(wire_in: int, wire_out: int, ready_fd: int, handshake: Handshake) -> Early:
    """Answer the handshake on the wire until `ready_fd` is readable (the SDK is imported); what the SDK must see.

    Reads whole lines only while answering; once a line is left for the SDK, reading stops, so the rest stays in
    the pipe for the SDK's reader.
    """
    responder = _Responder(wire_out, handshake)
    pending = b""
    watching = [wire_in, ready_fd]
    while True:
        readable, _, _ = select.select(watching, [], [])
        if ready_fd in readable:
            break
        chunk = os.read(wire_in, 1 << 16)
        if not chunk:
            watching = [ready_fd]  # EOF: the SDK reads it again from the pipe
            continue
        pending += chunk
        while responder.answering and b"\n" in pending:
            raw, _, pending = pending.partition(b"\n")
            responder.line(raw + b"\n")
        if not responder.answering:
            watching = [ready_fd]
    return responder.finish(pending)
