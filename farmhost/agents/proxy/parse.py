"""BodyParser: an agent's request body checked by a bounded scan, then parsed and rewritten off the event loop.

A body is at most `MAX_BODY_BYTES`, but JSON of tiny values grows about thirty-fold when built (an empty object
is 2 bytes of text and 64 of dict), and `json.loads` holds the GIL for the whole parse: eight 4 MiB bodies of `{}`
once took the daemon from 135 MB to 677 MB and blocked its loop for every group. So, in one worker thread:
1. a linear tokenising scan counts the values and the nesting depth, and refuses a body over `MAX_VALUES` or
   `MAX_DEPTH` as soon as it gets there (the scan yields the GIL between tokens, so the loop keeps running);
2. only then `json.loads`, which is now bounded (at most `MAX_VALUES` objects, a few MB and a few ms);
3. the rewrite (proxy/body.py), the check of image parts (proxy/images.py; with a photo, a second serialisation
   for the endpoints that cannot see it), and the serialisation, so the daemon holds bytes while the upstream
   answers, never the built body.
One thread for every run's bodies: one parsed body at a time in memory.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from farmhost.agents.proxy.body import TOKEN_FIELDS, BodyRefused, rewrite, wants_usage
from farmhost.agents.proxy.images import checked_images, without_images
from farmhost.agents.proxy.tokens import prompt_bound
from farmhost.config import LlmEndpoint

# JSON values (strings and object keys included) one body may hold. A long conversation with large tool schemas
# has a few thousand; 100,000 tiny ones parse in about 10 ms and take about 10 MB, which the worker can afford.
MAX_VALUES: Final = 100_000
# How deep arrays and objects may nest. Chat messages nest 4 levels, tool JSON Schemas rarely 20; the interpreter's
# own limit (about 1,000) would otherwise surface as an error nobody catches.
MAX_DEPTH: Final = 64

# Every this many tokens (about a millisecond of scanning) the scan sleeps, so the event loop's thread, waiting for
# the GIL after each of its system calls, gets it then rather than at the interpreter's 5 ms switch interval.
YIELD_EVERY: Final = 2048
YIELD_SECONDS: Final = 0.0002

# One JSON token: a string (an unterminated one runs to the end, so no position is scanned twice), an opening or
# closing bracket, a run of separators and whitespace (matched, not searched past: `finditer` searching 4 MiB of
# spaces is one 250 ms call that holds the GIL), or a bare literal or number. Atomic groups and possessive
# quantifiers keep every match linear; each match is one short call, between which the loop gets the GIL.
_TOKEN: Final = re.compile(
    rb'"(?>[^"\\]*+(?:\\.[^"\\]*+)*+)(?:"|\\?\Z)|([\[{])|([\]}])|([\s,:]++)|[^\s,:\[\]{}"]++',
    re.DOTALL,
)


@dataclass(frozen=True, kw_only=True)
class PreparedBody:
    """A body ready to forward: its JSON without `model`, and what the handler needs to know of it."""

    without_model: bytes  # a JSON object with at least `messages`, serialised
    stream: bool
    relay_usage: bool  # the agent asked for a stream's usage chunk itself
    prompt_bound: int  # the most prompt tokens it may cost (proxy/tokens.py), held until its usage is known
    completion_bound: int  # its max_tokens (capped): the most the answer may cost
    images: int = 0  # image parts (each one of the run's photos)
    text_only: bytes | None = None  # with images: the same body, each image part a text part saying what it was

    def for_endpoint(self, endpoint: LlmEndpoint) -> bytes:
        """The body to POST to `endpoint`: its model set, and no image part unless it can see."""
        base = self.without_model if endpoint.vision or self.text_only is None else self.text_only
        return base[:-1] + b', "model": ' + json.dumps(endpoint.model).encode() + b"}"


def scan(raw: bytes, *, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a body with more than `max_values` JSON values or nested deeper than `max_depth`, without building it.

    Only counts: whether the text is JSON is `json.loads`'s to say.

    Raises:
        BodyRefused: over either limit.
    """
    values = depth = 0
    for count, token in enumerate(_TOKEN.finditer(raw)):
        if count % YIELD_EVERY == 0:
            time.sleep(YIELD_SECONDS)
        if token.group(3) is not None:
            continue
        if token.group(2) is not None:
            depth -= 1
            continue
        values += 1
        if values > max_values:
            raise BodyRefused(
                f"the request body holds more than {max_values} JSON values; "
                "send a shorter conversation or smaller tool schemas"
            )
        if token.group(1) is not None:
            depth += 1
            if depth > max_depth:
                raise BodyRefused(f"the request body nests arrays and objects deeper than {max_depth} levels")


def _constant(name: str) -> Any:
    raise BodyRefused(f"the request body is not JSON ({name} is not a JSON number)")


def prepare(raw: bytes, *, max_tokens: int, photos: Mapping[str, str] | None = None) -> PreparedBody:
    """Scan, parse and rewrite one body (blocking: call it through `BodyParser`); `photos`: the run's, URL -> path.

    Raises:
        BodyRefused: what is wrong with the body, in a sentence for the agent.
    """
    scan(raw)
    try:
        body = json.loads(raw, parse_constant=_constant)
    except BodyRefused:  # from `_constant`
        raise
    except RecursionError:  # not reached after the scan; kept so that nothing escapes as a 500
        raise BodyRefused(f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"
        raise BodyRefused(f"the request body is not JSON ({err.msg} at {where})") from None
    except ValueError as err:  # not UTF-8, UTF-16 or UTF-32
        raise BodyRefused(f"the request body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise BodyRefused("the request body must be a JSON object")
    relay_usage = wants_usage(body)
    body = rewrite(body, model="", max_tokens=max_tokens)
    del body["model"]
    images = checked_images(body, photos or {})
    text_only = without_images(body, photos or {}) if images else None
    without_model = json.dumps(body).encode()
    text_bytes = json.dumps(text_only).encode() if text_only is not None else None
    return PreparedBody(
        without_model=without_model,
        stream=bool(body.get("stream")),
        relay_usage=relay_usage,
        # an image counts as its tokens, not as the bytes of its base64
        prompt_bound=prompt_bound(text_only if text_only is not None else body, images),
        completion_bound=max(body.get(name) or 0 for name in TOKEN_FIELDS),
        images=images,
        text_only=text_bytes,
    )


class BodyParser:
    """The one worker thread every run's request bodies are prepared in."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Make the worker (its thread starts with the first body)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-body")

    def stop(self) -> None:
        """Let the worker go; a body being prepared finishes in the background."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def prepare(self, raw: bytes, *, max_tokens: int, photos: Mapping[str, str] | None = None) -> PreparedBody:
        """`prepare(raw)` in the worker.

        Raises:
            BodyRefused: what is wrong with the body.
        """
        assert self._executor is not None, "start() the parser first"
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: prepare(raw, max_tokens=max_tokens, photos=photos))
