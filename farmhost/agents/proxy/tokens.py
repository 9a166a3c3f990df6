"""What a request used in tokens: the upstream's own `usage` figures read, or an estimate by characters without them.

The budgets (proxy/budget.py) count what an answer's `usage` reports; a stream that is cut or reports nothing is
counted by CHARS_PER_TOKEN over the prompt and the deltas that arrived (proxy/stream.py).
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

# A common rule of thumb for English text and JSON with the usual tokenizers; used only when no usage is reported.
CHARS_PER_TOKEN: Final = 4


def reported_tokens(usage: object) -> tuple[int, int] | None:
    """The prompt and completion tokens of a `usage` object; None when it is not one or its figures are not numbers."""
    if not isinstance(usage, dict):
        return None
    try:
        return max(0, int(usage.get("prompt_tokens") or 0)), max(0, int(usage.get("completion_tokens") or 0))
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e999 parses as infinity
        return None


def answer_tokens(data: bytes) -> tuple[int, int]:
    """The prompt and completion tokens a buffered answer's `usage` reports (0, 0 when it reports none)."""
    try:
        answer = json.loads(data)
    except ValueError:
        return 0, 0
    if not isinstance(answer, dict):
        return 0, 0
    return reported_tokens(answer.get("usage")) or (0, 0)


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A request's prompt tokens by CHARS_PER_TOKEN over its messages and tools, for a stream without usage."""
    text = json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False)
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_completion_tokens(chars: int) -> int:
    """The completion tokens of `chars` characters of deltas, by CHARS_PER_TOKEN."""
    return math.ceil(chars / CHARS_PER_TOKEN)
