"""stdin/stdout for the MCP SDK's `stdio_server` on the event loop itself, without a thread hop per line.

The SDK's own streams (`anyio.wrap_file`) run every `readline`, `write` and `flush` in a worker thread: three
thread hops and event-loop wake-ups per tool call, about a millisecond on a small machine. When stdin and stdout
are pipes or sockets (as every MCP client spawns its server), `piped_stdio` serves them with asyncio's pipe
transports instead (`claim_stdio`, then `piped_stdio`) and gives `stdio_server(stdin, stdout)` objects it accepts;
otherwise (a terminal, a file) the SDK's own streams are used.

Like the SDK's own claim of fd 0 and 1, the wire moves to private descriptors while serving: fd 0 reads the null
device and fd 1 goes to stderr, so stray output of a handler cannot corrupt the JSON-RPC stream. Both are put
back on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

# A line (one JSON-RPC message) may be large: a memory_write of a long file. The reader grows to this.
_LINE_LIMIT = 1 << 30


def _is_stream(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Writer(asyncio.Protocol):
    """Flow control for the stdout transport: `drain` waits while the pipe's buffer is over its high mark."""

    def __init__(self) -> None:
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.lost = asyncio.Event()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()
        self._can_write.set()

    async def drain(self) -> None:
        await self._can_write.wait()


class PipeIn:
    """`async for line in stdin` over an asyncio pipe transport: UTF-8 text lines, undecodable bytes replaced."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            line = await self._reader.readline()
            if not line:
                return
            yield line.decode("utf-8", errors="replace")


class PipeOut:
    """`await write(text)` and `await flush()` over an asyncio pipe transport (non-blocking, flow-controlled)."""

    def __init__(self, transport: asyncio.WriteTransport, protocol: _Writer) -> None:
        self._transport = transport
        self._protocol = protocol

    async def write(self, text: str) -> int:
        """Queue `text` on the pipe (never blocks the loop; `flush` waits while the pipe is full)."""
        if self._transport.is_closing():
            raise BrokenPipeError("the MCP client closed its end of stdout")
        self._transport.write(text.encode("utf-8"))
        return len(text)

    async def flush(self) -> None:
        """Wait until the pipe's buffer is below its high-water mark."""
        await self._protocol.drain()


@dataclass
class Wire:
    """The client's stdin and stdout on private descriptors; fd 0 reads the null device and fd 1 is stderr."""

    fd_in: int
    fd_out: int

    def restore(self) -> None:
        """Put the wire back on fd 0 and 1."""
        for wire, fd in ((self.fd_in, 0), (self.fd_out, 1)):
            with contextlib.suppress(OSError):
                os.dup2(wire, fd)
            with contextlib.suppress(OSError):
                os.close(wire)


def claim_stdio() -> Wire | None:
    """Move the wire off fd 0 and 1 when both are pipes or sockets; None (nothing moved) otherwise."""
    if not (_is_stream(0) and _is_stream(1)):
        return None
    wire = Wire(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3), fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3))
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return wire


@contextlib.asynccontextmanager
async def piped_stdio(wire: Wire) -> AsyncIterator[tuple[Any, Any]]:
    """`(stdin, stdout)` for `stdio_server` on `wire`."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_LINE_LIMIT, loop=loop)
    # The transports own (and close) duplicates, so that `wire` can still be restored afterwards.
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(os.dup(wire.fd_in), "rb", buffering=0)
    )
    write_transport, protocol = await loop.connect_write_pipe(
        _Writer, os.fdopen(os.dup(wire.fd_out), "wb", buffering=0)
    )
    try:
        yield PipeIn(reader), PipeOut(write_transport, protocol)
    finally:
        read_transport.close()
        write_transport.close()
