"""UpstreamClient: the proxy's side toward the LLM endpoints: the HTTP session, the fallback walk, the key, redaction.

A prepared body is POSTed to each endpoint in the chain's order (proxy/chain.py) until one answers below 500, with
the endpoint's key added, its model set and, for one that cannot see, each image part made text (proxy/images.py);
a buffered answer is read within MAX_RESPONSE_BYTES. Whatever comes back toward an agent passes through `redact`,
so no endpoint's key ever reaches one. Each endpoint given up on after it took the request (no answer in time) is
counted in the request's `Attempts`: it may have done the work, so the budgets charge it (proxy/exchange.py).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Final

import aiohttp

from farmhost.agents.proxy.chain import EndpointChain
from farmhost.agents.proxy.parse import PreparedBody
from farmhost.config import LlmEndpoint

# A hosted model answers in seconds, a model on a Pi's neighbour in minutes; the run's own timeout bounds it too.
LLM_REQUEST_TIMEOUT: Final = 300.0
# A connection to an endpoint is up within this long or the next endpoint is tried: a blackholed hosted endpoint (the
# farm's internet is down) must not hold a request for the whole LLM_REQUEST_TIMEOUT.
CONNECT_TIMEOUT: Final = 10.0
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Upstream:
    """An endpoint's response (its headers in), which endpoint it is, and how many were tried for it."""

    response: aiohttp.ClientResponse
    endpoint: LlmEndpoint
    tried: int


@dataclass
class Attempts:
    """What one request's walk over the endpoints left unaccounted for."""

    # Endpoints given up on for want of an answer after the connection was up: each may have done (and billed) the
    # work. One that refused the connection, could not be connected to in time, or answered 5xx did not.
    timed_out: int = 0

    def failed(self, err: BaseException) -> None:
        """An endpoint failed with `err`."""
        if isinstance(err, TimeoutError) and not isinstance(err, aiohttp.ConnectionTimeoutError):
            self.timed_out += 1


def failure_reason(err: BaseException, timeout: float) -> str:
    """Why an endpoint did not answer, without its URL (which may carry credentials)."""
    if isinstance(err, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(err, aiohttp.ClientConnectorError) and err.os_error.errno:
        return os.strerror(err.os_error.errno)  # its own text names the address
    return type(err).__name__


class UpstreamClient:
    """Sends the proxy's requests to the configured endpoints; one per LlmProxy, shared by every run."""

    def __init__(self, endpoints: tuple[LlmEndpoint, ...], *, cooldown: float, timeout: float) -> None:
        """A client for `endpoints` (in the operator's order); nothing opens before `start()`.

        Args:
            endpoints: the configured endpoints (empty: no LLM).
            cooldown: seconds a failed endpoint is tried last.
            timeout: seconds an endpoint has to answer one buffered request.
        """
        self._chain = EndpointChain(endpoints, cooldown=cooldown)
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Open the HTTP session (when an endpoint is configured)."""
        if self._chain.endpoints and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))

    async def stop(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def configured(self) -> bool:
        """An LLM endpoint is configured and the session is open."""
        return self._session is not None and bool(self._chain.endpoints)

    @property
    def endpoints(self) -> tuple[LlmEndpoint, ...]:
        """The endpoints in the operator's order (the first is FARMHOST_LLM_*)."""
        return self._chain.endpoints

    async def forward(self, body: PreparedBody, attempts: Attempts) -> tuple[int, bytes, str, LlmEndpoint]:
        """POST `body` to the chat completions of the first endpoint that answers; status, body, type, endpoint.

        Raises:
            aiohttp.ClientError, TimeoutError: no endpoint could be reached or answered in time.
        """
        upstream = await self.open(body, attempts)
        async with upstream.response as response:
            try:
                data = await self.read(response)
            except (TimeoutError, aiohttp.ClientError) as err:
                attempts.failed(err)
                raise
            return response.status, data, response.content_type, upstream.endpoint

    async def open(
        self, body: PreparedBody, attempts: Attempts, *, stream: bool = False, headers_within: float | None = None
    ) -> Upstream:
        """POST `body` to each endpoint in the chain's order until one answers below 500; its response (headers in).

        An endpoint that cannot be reached, sends no headers within `headers_within` seconds or answers 5xx is
        marked failed (proxy/chain.py) and the next is tried; the last one's failure is what the caller gets. Each
        failure is told to `attempts`. The caller releases the response. A stream has no aiohttp deadline: the caller bounds the rest of it.

        Raises:
            aiohttp.ClientError, TimeoutError: the last endpoint tried cannot be reached or does not answer in time.
        """
        order = self._chain.order()
        for index, endpoint in enumerate(order):
            after = order[index + 1] if index + 1 < len(order) else None
            try:
                async with asyncio.timeout(headers_within):
                    response = await self._post(endpoint, body, stream=stream)
            except (TimeoutError, aiohttp.ClientError) as err:
                attempts.failed(err)
                self._chain.failed(endpoint, failure_reason(err, headers_within or self.timeout), next_one=after)
                if after is None:
                    raise
                continue
            if response.status < 500:
                self._chain.answered(endpoint)
                return Upstream(response=response, endpoint=endpoint, tried=index + 1)
            self._chain.failed(endpoint, f"HTTP {response.status}", next_one=after)
            if after is None:
                return Upstream(response=response, endpoint=endpoint, tried=index + 1)
            response.release()
        raise AssertionError("open() needs a configured LLM (see `configured`)")

    async def _post(self, endpoint: LlmEndpoint, body: PreparedBody, *, stream: bool) -> aiohttp.ClientResponse:
        assert self._session is not None
        accept = "text/event-stream" if stream else "application/json"
        headers = {"Content-Type": "application/json", "Accept": accept}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        url = f"{endpoint.base_url}/chat/completions"
        total = None if stream else self.timeout
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=CONNECT_TIMEOUT)
        return await self._session.post(url, data=body.for_endpoint(endpoint), headers=headers, timeout=timeout)

    async def read(self, response: aiohttp.ClientResponse) -> bytes:
        """A buffered answer's body, redacted.

        Raises:
            aiohttp.ClientError: it is over MAX_RESPONSE_BYTES or cut.
        """
        data = bytearray()
        async for chunk in response.content.iter_any():  # read(n) stops at what has arrived so far
            data += chunk
            if len(data) > MAX_RESPONSE_BYTES:
                raise aiohttp.ClientPayloadError(f"the answer is over {MAX_RESPONSE_BYTES} bytes")
        return self.redact(bytes(data))

    def redact(self, data: bytes) -> bytes:
        """`data` with every endpoint's API key replaced by `[redacted]`."""
        for endpoint in self._chain.endpoints:
            key = endpoint.api_key
            if key and len(key) >= 4:
                data = data.replace(key.encode(), b"[redacted]")
        return data
