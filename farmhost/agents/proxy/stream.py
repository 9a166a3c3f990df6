"""StreamRelay: one streamed chat completion relayed to the agent event by event as it arrives, and what it used.

The upstream's `text/event-stream` is cut into events at blank lines. Each whole event is redacted (the key never
reaches the agent, as in a buffered answer) and written at once; nothing waits for the end. The tally reads each
event's `usage` (the proxy always asks for it with `stream_options.include_usage`); a stream that is cut, or an
upstream that reports no usage, is charged the bound the budgets held for it (proxy/tokens.py). An upstream that
dies mid-stream (cut, idle for too long, over its deadline, over the size cap) ends
the agent's stream with an OpenAI-style error event, `data: {"error": {...}}`, and the response closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from aiohttp import web

from farmhost.agents.proxy.errors import error_json
from farmhost.agents.proxy.tokens import reported_tokens

logger = logging.getLogger(__name__)

# Events are separated by a blank line; the SSE format allows all three line endings.
_SEPARATOR: Final = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# One event is one chunk of a completion, a few hundred bytes; 1 MiB is a whole tool call's arguments in one event.
MAX_EVENT_BYTES: Final = 1024 * 1024
DONE: Final = b"[DONE]"


class EventTooLarge(ValueError):
    """The upstream sent more than MAX_EVENT_BYTES without ending an event."""


class EventSplitter:
    """Bytes in, whole events out (each without its blank line)."""

    def __init__(self, max_event: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The events that `data` completes.

        Raises:
            EventTooLarge: an event grew over the cap.
        """
        start = max(0, len(self._buffer) - 3)  # a separator may straddle two reads
        self._buffer += data
        events: list[bytes] = []
        taken = 0
        for match in _SEPARATOR.finditer(self._buffer, start):
            events.append(bytes(self._buffer[taken : match.start()]))
            taken = match.end()
        del self._buffer[:taken]
        if len(self._buffer) > self._max:
            raise EventTooLarge(f"an event of the stream is over {self._max} bytes")
        return events

    def rest(self) -> bytes:
        """What is left after the last separator (an event the upstream did not end)."""
        return bytes(self._buffer)


def _data_of(event: bytes) -> bytes | None:
    """The `data` field of an event (lines joined), or None for a comment or an event without data."""
    lines = [line for line in re.split(rb"\r\n|\n|\r", event) if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


@dataclass
class StreamTally:
    """What one stream said about itself: its reported usage, whether it finished."""

    relay_usage: bool  # the agent asked for the usage chunk; otherwise a usage-only chunk is not passed on
    reported: tuple[int, int] | None = None
    done: bool = False
    errored: bool = False

    def see(self, event: bytes) -> bool:
        """Take one event into account; returns whether it is passed on to the agent."""
        data = _data_of(event)
        if data is None:
            return True  # a comment (a keep-alive): it keeps the agent's client waiting too
        if data.strip() == DONE:
            self.done = True
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            return True
        if not isinstance(chunk, dict):
            return True
        if chunk.get("error"):
            self.errored = True
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.reported = reported_tokens(usage) or self.reported
            if not self.relay_usage and not chunk.get("choices"):
                return False  # the agent did not ask for it, and a client that did not may choke on empty choices
        return True


def error_event(message: str, kind: str) -> bytes:
    """An OpenAI-style error event, which the openai client raises as an APIError."""
    return b"data: " + error_json(message, kind).encode() + b"\n\n"


class StreamCut(Exception):
    """The upstream's stream ended badly; `message` is for the agent and the log."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class AgentGone(Exception):
    """The agent closed its connection or stopped reading."""


@dataclass(kw_only=True)
class StreamRelay:
    """Relays one upstream stream to the agent; `run` never raises for what the upstream or the agent do."""

    tally: StreamTally
    redact: Callable[[bytes], bytes]
    total_timeout: float  # seconds the whole exchange may take (what `deadline` was set from)
    idle_timeout: float  # seconds the upstream may send nothing
    write_timeout: float  # seconds the agent may take to read what was written
    max_bytes: int
    name: str  # "llm <folder> run <id>", for the log
    log_extra: dict[str, str] = field(default_factory=dict)

    async def run(self, request: web.Request, upstream: aiohttp.ClientResponse, deadline: float) -> web.StreamResponse:
        """Answer `request` with `upstream`'s events until [DONE], a cut, or `deadline` (loop time)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await self._write(request, response, None)
            try:
                async with asyncio.timeout_at(deadline):
                    await self._pump(request, response, upstream)
            except TimeoutError:
                message = f"the LLM endpoint's stream did not end within {self.total_timeout:g} s"
                raise StreamCut(message, "upstream_timeout") from None
            await response.write_eof()
        except StreamCut as cut:
            logger.warning("%s: the stream was cut: %s", self.name, cut.message, extra=self.log_extra)
            try:
                await self._write(request, response, error_event(cut.message, cut.kind))
                await response.write_eof()
            except AgentGone:
                pass
        except AgentGone:
            logger.info("%s: the agent closed its stream before the end", self.name, extra=self.log_extra)
        return response

    async def _pump(self, request: web.Request, response: web.StreamResponse, upstream: aiohttp.ClientResponse) -> None:
        splitter = EventSplitter()
        received = 0
        while True:
            try:
                async with asyncio.timeout(self.idle_timeout):
                    data = await upstream.content.readany()
            except TimeoutError:
                raise StreamCut(
                    f"the LLM endpoint sent nothing for {self.idle_timeout:g} s", "upstream_timeout"
                ) from None
            except aiohttp.ClientError as err:
                raise StreamCut(
                    f"the LLM endpoint's stream was cut ({type(err).__name__})", "upstream_unavailable"
                ) from None
            if not data:
                break
            received += len(data)
            if received > self.max_bytes:
                raise StreamCut(f"the LLM endpoint's stream is over {self.max_bytes} bytes", "upstream_too_large")
            try:
                events = splitter.feed(data)
            except EventTooLarge as err:
                raise StreamCut(str(err), "upstream_too_large") from None
            out = b"".join(self.redact(event) + b"\n\n" for event in events if self.tally.see(event))
            if out:
                await self._write(request, response, out)
        rest = splitter.rest()
        if rest.strip() and self.tally.see(rest):
            await self._write(request, response, self.redact(rest) + b"\n\n")
        if not self.tally.done and not self.tally.errored:
            raise StreamCut("the LLM endpoint's stream ended before [DONE]", "upstream_unavailable")

    async def _write(self, request: web.Request, response: web.StreamResponse, data: bytes | None) -> None:
        """Prepare the response (`data` None) or write to it; an agent that does not read within the timeout is gone."""
        try:
            async with asyncio.timeout(self.write_timeout):
                if data is None:
                    await response.prepare(request)
                else:
                    await response.write(data)
        except (TimeoutError, ConnectionError) as err:
            raise AgentGone() from err
