"""OutputCapture: keeps the head and the tail of a stream within a byte budget, dropping (and counting) the middle."""

from __future__ import annotations

import asyncio
from typing import Final

READ_CHUNK: Final = 64 * 1024


class OutputCapture:
    """A bounded copy of one output stream: the first half of the budget and the last half.

    The tail is kept because the agent's result is its last stdout line; the head because the first error
    usually explains the rest.
    """

    def __init__(self, budget: int) -> None:
        self._head_budget = budget // 2
        self._tail_budget = budget - self._head_budget
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        """Add the next bytes of the stream."""
        room = self._head_budget - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        self._tail += data
        excess = len(self._tail) - self._tail_budget
        if excess > 0:
            del self._tail[:excess]
            self.dropped += excess

    async def drain(self, stream: asyncio.StreamReader) -> None:
        """Read `stream` to its end, so the writer never blocks on a full pipe, keeping what fits."""
        while chunk := await stream.read(READ_CHUNK):
            self.feed(chunk)

    def text(self) -> str:
        """Everything kept, with a marker where bytes were dropped."""
        head = self._head.decode(errors="replace")
        tail = self._tail.decode(errors="replace")
        if self.dropped:
            return f"{head}\n[... {self.dropped} bytes dropped: over the output limit ...]\n{tail}"
        return head + tail

    def last_line(self) -> str | None:
        """The last non-empty line, unless it began in the dropped middle."""
        data = bytes(self._tail) if self.dropped else bytes(self._head + self._tail)
        body = data.rstrip()
        cut = body.rfind(b"\n")
        if cut < 0 and self.dropped:
            return None
        return body[cut + 1 :].strip().decode(errors="replace") or None
