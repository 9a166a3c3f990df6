"""A TCP relay a test puts between farmhost and Home Assistant, to cut every connection and refuse new ones a while.

Real sockets and threads (no mock): `cut()` closes every relayed connection and refuses new ones (accepted, then
closed at once, as a dead link looks to a client), `heal()` relays again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Final, Self

_CHUNK: Final = 65536


class TcpRelay:
    """Listens on 127.0.0.1:<port> and relays each connection to `target_port` on 127.0.0.1."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.accepted = 0
        threading.Thread(target=self._accept, name="tcp-relay", daemon=True).start()

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`: HA's URL through the relay."""
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Close every relayed connection now and refuse new ones until heal()."""
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for sock in doomed:
            _close(sock)

    def heal(self) -> None:
        """Relay new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Stop listening and close everything."""
        self._closed = True
        self.cut()
        _close(self._server)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(_CHUNK):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with self._lock:
                    self._open.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
