"""ContextSizes: the LLM endpoints' context in tokens, asked where a server says it, for the built-in runner.

The runner reaches the model only through the proxy's socket, so it cannot ask the server; the host asks each
endpoint beside its OpenAI base URL (the URL without its `/v1`):

- llama.cpp: `GET /props`, `default_generation_settings.n_ctx` (a slot's context, `-c` / `-np`);
- Ollama: `POST /api/show` with the model. Its OpenAI-compatible API takes no `num_ctx` of its own (an `options`
  field is ignored there), so what applies is the model's `num_ctx` parameter (its Modelfile) if it has one, else
  the context the loaded model got (`GET /api/ps`, `context_length`: OLLAMA_CONTEXT_LENGTH, or Ollama's default by
  VRAM), else, the model not loaded yet, Ollama's default for a machine without a large GPU (4096 tokens), never
  more than the model's own `<arch>.context_length`. A longer prompt is cut by Ollama without an error (its log
  says "truncating input prompt"), so a guess errs small.

The run gets the smallest of FARMHOST_LLM_CONTEXT_TOKENS and every size an endpoint said: any endpoint of the
chain may answer any request. An endpoint that says nothing (a hosted API) counts only through the setting.
Answers are kept KNOWN_TTL seconds (what was not learned, UNKNOWN_TTL); asking runs in tasks of its own with
ASK_TIMEOUT, and a run waits for them at most RUN_WAIT seconds, so an endpoint that does not answer never holds a
run: the run goes on with what is known and the answer, if it comes, serves the next.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from farmhost.config import LlmEndpoint

logger = logging.getLogger(__name__)

ASK_TIMEOUT: Final = 5.0  # one endpoint's questions, all of them
RUN_WAIT: Final = 2.0  # what a run waits for questions still out
KNOWN_TTL: Final = 300.0  # a server's context changes only with a restart; learned again within five minutes
UNKNOWN_TTL: Final = 60.0  # an endpoint that said nothing (or only Ollama's default) is asked again after a minute
MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024  # /api/show carries the model's template and licence
OLLAMA_DEFAULT_CONTEXT: Final = 4096  # Ollama's default below 24 GiB of VRAM (docs.ollama.com/context-length)


@dataclass(frozen=True)
class ContextSize:
    """A context in tokens and where the figure comes from (said in the run log)."""

    tokens: int
    source: str


@dataclass
class _Known:
    size: ContextSize | None
    until: float


class ContextSizes:
    """Each endpoint's context as its server says it, cached; the run's is the smallest with the setting."""

    def __init__(
        self,
        endpoints: tuple[LlmEndpoint, ...],
        *,
        setting: int | None,
        ask_timeout: float = ASK_TIMEOUT,
        run_wait: float = RUN_WAIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Sizes for `endpoints`; `setting` is FARMHOST_LLM_CONTEXT_TOKENS. Nothing is asked before `start()`."""
        self._endpoints = endpoints
        self._setting = setting
        self._ask_timeout = ask_timeout
        self._run_wait = run_wait
        self._clock = clock
        self._known: dict[int, _Known] = {}
        self._asking: dict[int, asyncio.Task[ContextSize | None]] = {}
        self._asked_at: dict[int, float] = {}
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Open the HTTP session and start asking every endpoint (the first run finds the answers ready)."""
        if self._endpoints and self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._ask_timeout))
            for endpoint in self._endpoints:
                self._ask(endpoint)

    async def stop(self) -> None:
        """Cancel the questions still out and close the session."""
        for task in self._asking.values():
            task.cancel()
        if self._asking:
            await asyncio.wait(self._asking.values())
        self._asking.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def for_run(self) -> ContextSize | None:
        """The context a run's prompt must fit: the smallest said, or None when nothing is known.

        A stale answer is used while it is asked again. An endpoint never heard from yet is waited for until
        `run_wait` seconds after its question went out (not each run anew): a silent endpoint costs the runs of
        those seconds at most, then they go on without it until it answers.
        """
        if self._session is not None:
            now = self._clock()
            for endpoint in self._endpoints:
                known = self._known.get(endpoint.number)
                if known is None or known.until <= now:
                    self._ask(endpoint)
            first = [(task, self._asked_at[n]) for n, task in self._asking.items() if n not in self._known]
            if first:
                left = max(asked for _, asked in first) + self._run_wait - now
                if left > 0:
                    await asyncio.wait([task for task, _ in first], timeout=left)
        sizes = [known.size for known in self._known.values() if known.size is not None]
        if self._setting is not None:
            sizes.append(ContextSize(self._setting, "FARMHOST_LLM_CONTEXT_TOKENS"))
        return min(sizes, key=lambda size: size.tokens, default=None)

    def _ask(self, endpoint: LlmEndpoint) -> None:
        number = endpoint.number
        if number not in self._asking:
            task = asyncio.create_task(self._asked(endpoint), name=f"context of LLM endpoint {number}")
            self._asking[number], self._asked_at[number] = task, self._clock()
            task.add_done_callback(lambda _: self._asking.pop(number, None))

    async def _asked(self, endpoint: LlmEndpoint) -> ContextSize | None:
        before = self._known.get(endpoint.number)
        said = before.size if before is not None else None
        size: ContextSize | None = None
        sure = False
        try:
            async with asyncio.timeout(self._ask_timeout):
                size, sure = await self._ask_server(endpoint)
        except TimeoutError:
            why, size = f"no answer within {self._ask_timeout:g} s", said  # down for now: its size has not changed
        except (aiohttp.ClientError, OSError, ValueError) as err:
            why, size = type(err).__name__, said
        else:
            why = "neither llama.cpp's /props nor Ollama's /api/show says it"
        ttl = KNOWN_TTL if sure else UNKNOWN_TTL
        self._known[endpoint.number] = _Known(size=size, until=self._clock() + ttl)
        if size is not None and size != said:
            logger.info("LLM endpoint %d (%s): context %d tokens (%s)", endpoint.number, endpoint.label,
                        size.tokens, size.source)  # fmt: skip
        elif size is None and (before is None or said is not None):
            covered = (
                "FARMHOST_LLM_CONTEXT_TOKENS covers it" if self._setting else "FARMHOST_LLM_CONTEXT_TOKENS is unset"
            )
            logger.info("LLM endpoint %d (%s): its context is unknown (%s); %s", endpoint.number, endpoint.label,
                        why, covered)  # fmt: skip
        return size

    async def _ask_server(self, endpoint: LlmEndpoint) -> tuple[ContextSize | None, bool]:
        """The endpoint's context and whether the server said it (False: Ollama's default guessed, or nothing)."""
        where = f"endpoint {endpoint.number}, {endpoint.label}"
        props = await self._json(endpoint, "GET", "/props")
        n_ctx = _positive(_dig(props, "default_generation_settings", "n_ctx"))
        if n_ctx is not None:
            return ContextSize(n_ctx, f"llama.cpp /props of {where}"), True
        show = await self._json(endpoint, "POST", "/api/show", {"model": endpoint.model})
        if not isinstance(show, dict):
            return None, False
        num_ctx = _parameter(show.get("parameters"), "num_ctx")
        if num_ctx is not None:
            return ContextSize(num_ctx, f"Ollama's num_ctx of {endpoint.model} ({where})"), True
        running = await self._json(endpoint, "GET", "/api/ps")
        for model in _dig(running, "models") or ():
            if isinstance(model, dict) and endpoint.model in (model.get("model"), model.get("name")):
                loaded = _positive(model.get("context_length"))
                if loaded is not None:
                    return ContextSize(loaded, f"Ollama's loaded context of {endpoint.model} ({where})"), True
        trained = _trained_context(show.get("model_info"))
        tokens = min(OLLAMA_DEFAULT_CONTEXT, trained or OLLAMA_DEFAULT_CONTEXT)
        return ContextSize(tokens, f"Ollama's default context, {endpoint.model} not loaded yet ({where})"), False

    async def _json(self, endpoint: LlmEndpoint, method: str, path: str, body: Any = None) -> Any:
        """The JSON document a 200 answer carries, or None (another status, too big, not JSON)."""
        assert self._session is not None
        headers = {"Accept": "application/json"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        async with self._session.request(method, _root(endpoint.base_url) + path, json=body, headers=headers) as answer:
            if answer.status != 200:
                return None
            data = bytearray()
            async for chunk in answer.content.iter_any():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    return None
        try:
            return json.loads(data)
        except ValueError:
            return None


async def said_by(endpoint: LlmEndpoint, *, timeout: float = ASK_TIMEOUT) -> ContextSize | None:
    """What one endpoint says of its context, asked once (doctor's line; a run uses ContextSizes)."""
    sizes = ContextSizes((endpoint,), setting=None, ask_timeout=timeout, run_wait=timeout)
    sizes.start()
    try:
        return await sizes.for_run()
    finally:
        await sizes.stop()


def _root(base_url: str) -> str:
    """The server's root: the OpenAI base URL without its `/v1`."""
    url = urlsplit(base_url)
    return urlunsplit((url.scheme, url.netloc, url.path.rstrip("/").removesuffix("/v1"), "", ""))


def _dig(document: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _parameter(parameters: Any, name: str) -> int | None:
    """An integer parameter of Ollama's `parameters` text (`num_ctx 8192` lines)."""
    if not isinstance(parameters, str):
        return None
    for line in parameters.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == name:
            try:
                return _positive(int(value.strip()))
            except ValueError:
                return None
    return None


def _trained_context(model_info: Any) -> int | None:
    """The model's own context (`<architecture>.context_length` of /api/show's model_info)."""
    arch = _dig(model_info, "general.architecture")
    if not isinstance(arch, str):
        return None
    return _positive(_dig(model_info, f"{arch}.context_length"))
