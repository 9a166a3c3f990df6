"""What a request costs in tokens: a bound held before it goes upstream, settled to the upstream's own `usage`.

The bound (`prompt_bound` + the request's capped max_tokens) is one token per UTF-8 byte of the JSON body, each
image part counted as IMAGE_TOKENS rather than its base64, plus what the answer may add. No byte-level tokenizer
(GPT's, Llama 3's, Qwen's; SentencePiece with byte fallback) makes more tokens of a text than it has UTF-8 bytes, and
the body's quotes, keys and escapes outweigh a chat template's few tokens a message; a request goes past its bound
only by what a template adds beyond that (a default system prompt of a few dozen tokens) or an image that costs an
endpoint more than IMAGE_TOKENS. The budgets (proxy/budget.py) hold the bound until the answer's `usage` replaces it;
an answer without one (a stream cut or left, an upstream that reports none) is charged the bound.
"""

from __future__ import annotations

import json

from farmhost.agents.proxy.images import IMAGE_TOKENS


def reported_tokens(usage: object) -> tuple[int, int] | None:
    """The prompt and completion tokens of a `usage` object; None when it is not one or its figures are not numbers."""
    if not isinstance(usage, dict):
        return None
    try:
        return max(0, int(usage.get("prompt_tokens") or 0)), max(0, int(usage.get("completion_tokens") or 0))
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e999 parses as infinity
        return None


def answer_tokens(data: bytes) -> tuple[int, int] | None:
    """The prompt and completion tokens a buffered answer's `usage` reports (None when it reports none)."""
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    return reported_tokens(answer.get("usage"))


def prompt_bound(body: object, images: int) -> int:
    """The most prompt tokens a body may cost: a token a byte of it (without images) and IMAGE_TOKENS each.

    Its bytes as UTF-8, not as the ASCII-escaped JSON forwarded: that spells a Cyrillic letter in 6 bytes (an emoji
    in 12), where a tokenizer sees its 2 (4), and would hold a farmer writing in another script to a third of the day.
    A lone surrogate (which a JSON escape can spell) counts its 3 bytes.
    """
    return len(json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")) + images * IMAGE_TOKENS
