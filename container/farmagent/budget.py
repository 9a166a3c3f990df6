"""The context budget: how many tokens the endpoint holds, and what a request of the run would need.

A server truncates (llama.cpp), refuses (OpenAI) or silently drops the start of (Ollama) a prompt longer than
its context, and a truncated prompt loses the system prompt first. So the runner learns the context size where
it can: FARMAGENT_LLM_CONTEXT_TOKENS, which the host passes (the smallest of FARMHOST_LLM_CONTEXT_TOKENS and
what its endpoints say: llama.cpp's /props, Ollama's /api/show; farmhost/agents/proxy/context.py) with where it
has it from (FARMAGENT_LLM_CONTEXT_SOURCE), else, with a plain base URL (development, the benches), llama.cpp's
`GET /props`. Through the host's proxy, when the host knows nothing, the size is unknown and nothing is trimmed
beyond the conversation's own bounds (conversation.py).

Tokens are estimated, not counted (the runner has no tokenizer): UTF-8 bytes / BYTES_PER_TOKEN plus a few
tokens a message for the template. Measured on llama.cpp with SmolLM2's tokenizer, this prompt's English and
JSON run 3.3-4 bytes a token; 3 errs on the safe side.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from farmagent.config import AgentSettings

logger = logging.getLogger(__name__)

BYTES_PER_TOKEN: Final = 3.0
TOKENS_PER_MESSAGE: Final = 8  # role markers and separators of a chat template
# Room kept for the answer (and a tool call's arguments): a quarter of the context, at most this.
MAX_ANSWER_RESERVE: Final = 1024
PROPS_TIMEOUT: Final = 3.0
MAX_PROPS_BYTES: Final = 1 << 20
# An image part counts as this many tokens, not its base64 text (a 1024 px photo is ~1,000 tokens to a vision
# model; the host's proxy estimates it the same way).
IMAGE_TOKENS: Final = 1000


def estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
    """The tokens a request with these messages and tools is likely to take (rounded up)."""
    size = len(json.dumps(tools, ensure_ascii=False).encode()) if tools else 0
    images = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            kept = [part for part in content if not (isinstance(part, dict) and part.get("type") == "image_url")]
            images += len(content) - len(kept)
            message = {**message, "content": kept}
        size += len(json.dumps(message, ensure_ascii=False).encode())
    tokens = int(size / BYTES_PER_TOKEN) + 1 + TOKENS_PER_MESSAGE * (len(messages) + len(tools))
    return tokens + IMAGE_TOKENS * images


def prompt_limit(context: int) -> int:
    """The most prompt tokens to send to a context of `context` tokens, leaving room for the answer."""
    return context - min(MAX_ANSWER_RESERVE, context // 4)


def context_tokens(settings: AgentSettings) -> tuple[int | None, str]:
    """The endpoint's context size and where it comes from (None when unknown)."""
    if settings.llm_context_tokens is not None:
        return settings.llm_context_tokens, settings.llm_context_source or "FARMAGENT_LLM_CONTEXT_TOKENS"
    if settings.llm_base_url is None:
        return None, "unknown: the host learned it from no endpoint, and FARMHOST_LLM_CONTEXT_TOKENS is not set"
    asked = props_context(settings.llm_base_url)
    if asked is None:
        return None, f"unknown ({settings.llm_base_url} has no llama.cpp /props)"
    return asked, "the server's /props"


def props_context(base_url: str) -> int | None:
    """llama.cpp's `n_ctx` of a slot, from `GET /props` beside the OpenAI base URL; None if it does not say."""
    url = urllib.parse.urlsplit(base_url)
    path = url.path.rstrip("/").removesuffix("/v1") + "/props"
    kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = kind(url.netloc, timeout=PROPS_TIMEOUT)
    try:
        connection.request("GET", path, headers={"Accept": "application/json"})
        response = connection.getresponse()
        data = response.read(MAX_PROPS_BYTES + 1)
        if response.status != 200 or len(data) > MAX_PROPS_BYTES:
            return None
        document = json.loads(data)
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()
    settings = document.get("default_generation_settings") if isinstance(document, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
        return n_ctx
    return None
