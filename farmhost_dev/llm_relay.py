"""A recording HTTP relay to a llama.cpp server: what each chat completion cost the server's prompt cache.

The benches and tests put it between the runner (`FARMAGENT_LLM_BASE_URL=relay.base_url`) and the server of
farmhost_dev/local_llm.py. For each answered POST it records the body's size and the server's own figures:
`usage.prompt_tokens`, `usage.completion_tokens`, and `timings.prompt_n` (tokens read anew) against
`timings.cache_n` (tokens reused from the slot's cache). It caps each request's `max_tokens` at `max_tokens`
(settable between runs): an answer's length changes what the next request holds, not the prompt being read.

Usage:
    with Relay(llm.address, max_tokens=16) as relay:
        env["FARMAGENT_LLM_BASE_URL"] = relay.base_url
        ...
        relay.exchanges[-1].prompt_n
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

UPSTREAM_TIMEOUT = 600  # a loaded machine reads a long prompt with a small model in minutes


@dataclass
class Exchange:
    """One request through the relay: its body size and what the server said of its prompt and answer."""

    body_bytes: int
    prompt_tokens: int
    prompt_n: int
    cache_n: int
    completion_tokens: int


class Relay(ThreadingHTTPServer):
    """The relay on 127.0.0.1 (a port the kernel picks), serving in a thread between `with` and its end."""

    def __init__(self, upstream: str, *, max_tokens: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.max_tokens = max_tokens
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL the runner is given."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()


class _Handler(BaseHTTPRequestHandler):
    server: Relay

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _relay(self, data: bytes | None) -> None:
        request = urllib.request.Request(self.server.upstream + self.path, data=data, method=self.command)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT) as answer:
                status, body = answer.status, answer.read()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read()
        if data is not None and status == 200:
            document = json.loads(body)
            usage, timings = document.get("usage") or {}, document.get("timings") or {}
            self.server.exchanges.append(
                Exchange(
                    body_bytes=len(data),
                    prompt_tokens=int(usage.get("prompt_tokens", -1)),
                    prompt_n=int(timings.get("prompt_n", -1)),
                    cache_n=int(timings.get("cache_n", -1)),
                    completion_tokens=int(usage.get("completion_tokens", -1)),
                )
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._relay(None)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        body["max_tokens"] = self.server.max_tokens
        self._relay(json.dumps(body).encode())
