"""The OpenAI-shaped error the LLM proxy answers with itself: `{"error": {message, type, code}}`, in one place.

The same body goes out as an HTTP answer (proxy/exchange.py), as the raw response to a refused connection
(proxy/listener.py) and as the last event of a cut stream (proxy/stream.py); the openai client raises each as an
APIError carrying the message.
"""

from __future__ import annotations

import json


def error_json(message: str, kind: str) -> str:
    """The error body for `message`; `kind` is both its `type` and its `code`."""
    return json.dumps({"error": {"message": message, "type": kind, "code": kind}})
