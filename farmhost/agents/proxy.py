"""LlmProxy: the OpenAI-compatible endpoint agents reach through a Unix socket; the host adds the key, forces the model.

One socket per running group, `<data>/run/<folder>/llm.sock` (`/workspace/run/llm.sock` in the sandbox), open for the
run's duration. Served: `POST /v1/chat/completions` (forwarded to `FARMHOST_LLM_BASE_URL` + `/chat/completions`)
and `GET /v1/models` (answered here: the configured model is the only one an agent can use). Streaming is refused
with a 400: the runner does not need it and a buffered answer is what lets the host count tokens and cap sizes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from aiohttp import web

from farmhost.config import Settings
from farmhost.layout import DataLayout

logger = logging.getLogger(__name__)

SOCKET_NAME: Final = "llm.sock"
# A chat request carries the conversation and the tool schemas; 4 MiB is far beyond a turn-limited run's needs.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# A hosted model answers in seconds, a model on a Pi's neighbour in minutes; the run's own timeout bounds it too.
LLM_REQUEST_TIMEOUT: Final = 300.0
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
# Requests a run may make per allowed turn: a turn is one request, retries and the final answer need a few more.
REQUESTS_PER_TURN: Final = 4
NOT_CONFIGURED: Final = (
    "no LLM is configured on the host: set FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL "
    "(and FARMHOST_LLM_API_KEY if the endpoint needs a key) in farmhost's environment or .env, then restart it"
)


@dataclass
class ProxyUsage:
    """What one run did through the proxy."""

    max_requests: int
    requests: int = 0
    refused: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _error(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-shaped error; `x-should-retry: false` stops the openai client from retrying what cannot succeed."""
    body = {"error": {"message": message, "type": kind, "code": kind}}
    headers = {"x-should-retry": "false"} if status < 500 or status == 503 else {}
    return web.json_response(body, status=status, headers=headers)


class LlmProxy:
    """Serves the LLM proxy socket of a group while one of its runs is going on."""

    def __init__(
        self,
        *,
        settings: Settings,
        layout: DataLayout,
        request_timeout: float = LLM_REQUEST_TIMEOUT,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._settings = settings
        self._layout = layout
        self._timeout = request_timeout
        self._max_body = max_body_bytes
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the upstream HTTP session (when an LLM is configured)."""
        if self._settings.llm_enabled and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout))

    async def stop(self) -> None:
        """Close the upstream session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @asynccontextmanager
    async def serve(self, folder: str, run_id: str, *, max_requests: int) -> AsyncIterator[ProxyUsage]:
        """Listen on `<data>/run/<folder>/llm.sock` for the block; yields the run's usage counters.

        Raises:
            OSError: the socket cannot be created.
        """
        usage = ProxyUsage(max_requests=max_requests)
        handler = _RunHandler(self, folder, run_id, usage)
        app = web.Application(client_max_size=self._max_body)
        app.router.add_post("/v1/chat/completions", handler.chat_completions)
        app.router.add_get("/v1/models", handler.models)
        app.router.add_route("*", "/{tail:.*}", handler.unknown)
        directory = os.open(self._layout.create_group_run(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        try:
            sock = _bind(directory)
            await runner.setup()
            await web.SockSite(runner, sock).start()
            yield usage
        finally:
            await runner.cleanup()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SOCKET_NAME, dir_fd=directory)
            os.close(directory)

    async def forward(self, body: dict[str, Any]) -> tuple[int, bytes, str]:
        """POST `body` to the upstream's chat completions; returns status, body and content type.

        Raises:
            aiohttp.ClientError, TimeoutError: the upstream cannot be reached or does not answer in time.
        """
        assert self._session is not None and self._settings.llm_base_url is not None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._settings.llm_api_key:
            headers["Authorization"] = f"Bearer {self._settings.llm_api_key}"
        url = f"{self._settings.llm_base_url}/chat/completions"
        async with self._session.post(url, data=json.dumps(body).encode(), headers=headers) as response:
            data = await response.content.read(MAX_RESPONSE_BYTES + 1)
            if len(data) > MAX_RESPONSE_BYTES:
                raise aiohttp.ClientPayloadError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
            return response.status, self._redact(data), response.content_type

    @property
    def configured(self) -> bool:
        """An LLM endpoint is configured and the session is open."""
        return self._session is not None

    @property
    def model(self) -> str:
        """The model every request is sent with."""
        return self._settings.llm_model or ""

    @property
    def max_body_bytes(self) -> int:
        """The largest request body accepted."""
        return self._max_body

    @property
    def timeout(self) -> float:
        """The upstream request timeout in seconds."""
        return self._timeout

    def _redact(self, data: bytes) -> bytes:
        key = self._settings.llm_api_key
        return data.replace(key.encode(), b"[redacted]") if key and len(key) >= 4 else data


def _bind(directory: int) -> socket.socket:
    """A listening socket at `llm.sock` in `directory`, bound through `/proc/self/fd` (sun_path is 108 bytes)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET_NAME, dir_fd=directory)  # left by a daemon that was killed
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        short = f"/proc/self/fd/{directory}/{SOCKET_NAME}"
        sock.bind(short)
        os.chmod(short, 0o666)  # the sandbox's uid may differ from the daemon's; run/ itself is 0700
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


class _RunHandler:
    """The request handlers of one run's socket."""

    def __init__(self, proxy: LlmProxy, folder: str, run_id: str, usage: ProxyUsage) -> None:
        self._proxy = proxy
        self._folder = folder
        self._run_id = run_id
        self._usage = usage

    async def chat_completions(self, request: web.Request) -> web.Response:
        """Check, rewrite and forward one chat completion request."""
        started = time.monotonic()
        response = await self._chat(request)
        self._log(response.status, started)
        return response

    async def _chat(self, request: web.Request) -> web.Response:
        usage = self._usage
        if not self._proxy.configured:
            return _error(503, NOT_CONFIGURED, "llm_not_configured")
        if usage.requests >= usage.max_requests:
            usage.refused += 1
            message = (
                f"this run has used all of its {usage.max_requests} LLM requests; "
                "stop calling tools and give your final answer"
            )
            return _error(429, message, "run_request_limit")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"the request body is over {self._proxy.max_body_bytes} bytes", "request_too_large")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON", "invalid_request")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object", "invalid_request")
        if body.get("stream"):
            return _error(
                400, "streaming is not supported by the farmhost LLM proxy; send stream: false", "invalid_request"
            )
        body["model"] = self._proxy.model
        body.pop("stream_options", None)
        usage.requests += 1
        try:
            status, data, content_type = await self._proxy.forward(body)
        except TimeoutError:
            logger.warning(
                "llm %s run %s: no answer within %g s",
                self._folder,
                self._run_id,
                self._proxy.timeout,
                extra={"group": self._folder, "runId": self._run_id},
            )
            return _error(502, f"the LLM endpoint did not answer within {self._proxy.timeout:g} s", "upstream_timeout")
        except aiohttp.ClientError as err:
            logger.warning(
                "llm %s run %s: upstream unreachable: %s",
                self._folder,
                self._run_id,
                err,
                extra={"group": self._folder, "runId": self._run_id},
            )
            return _error(502, f"the host cannot reach the LLM endpoint ({_reason(err)})", "upstream_unavailable")
        if 200 <= status < 300:
            self._count_tokens(data)
        return web.Response(status=status, body=data, content_type=content_type or "application/json")

    def _count_tokens(self, data: bytes) -> None:
        try:
            reported = json.loads(data).get("usage") or {}
            self._usage.prompt_tokens += int(reported.get("prompt_tokens") or 0)
            self._usage.completion_tokens += int(reported.get("completion_tokens") or 0)
        except (ValueError, TypeError, AttributeError):
            pass  # no usage reported: nothing to count

    def _log(self, status: int, started: float) -> None:
        usage = self._usage
        logger.info(
            "llm %s run %s: HTTP %d in %d ms (request %d of %d; tokens so far %d prompt, %d completion)",
            self._folder,
            self._run_id,
            status,
            (time.monotonic() - started) * 1000,
            usage.requests,
            usage.max_requests,
            usage.prompt_tokens,
            usage.completion_tokens,
            extra={"group": self._folder, "runId": self._run_id},
        )

    async def models(self, request: web.Request) -> web.Response:
        """The one model the proxy sends requests with."""
        if not self._proxy.configured:
            return _error(503, NOT_CONFIGURED, "llm_not_configured")
        model = {"id": self._proxy.model, "object": "model", "created": 0, "owned_by": "farmhost"}
        return web.json_response({"object": "list", "data": [model]})

    async def unknown(self, request: web.Request) -> web.Response:
        """Anything else: a clear 404."""
        message = f"{request.method} {request.path} is not served; use POST /v1/chat/completions or GET /v1/models"
        return _error(404, message, "not_found")


def _reason(err: aiohttp.ClientError) -> str:
    """Why the upstream could not be reached, without its URL (which may carry credentials)."""
    if isinstance(err, aiohttp.ClientConnectorError) and err.os_error.errno:
        return os.strerror(err.os_error.errno)  # its own text names the address
    return type(err).__name__
