"""What of an agent's chat-completions body the LLM proxy forwards: known fields, the model forced, n and max_tokens capped.

A streamed request is sent with `stream_options: {"include_usage": true}` whatever the agent asked, so that the
upstream reports the tokens the budgets count. Pure: a dict in, a dict out (or the reason it is refused).
"""

from __future__ import annotations

from typing import Any, Final

# The chat-completions fields an agent may set. Anything else is refused by name, never passed on: provider routing
# (OpenRouter's `provider`, `models`, `route`, `transforms`), `service_tier`, `store`, audio or web search would let an
# agent choose what the farm pays for or where its conversation goes.
FORWARDED_FIELDS: Final = frozenset(
    {
        "messages",
        "model",  # replaced by the configured model
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "stop",
        "seed",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "reasoning_effort",
        "max_tokens",  # capped
        "max_completion_tokens",  # capped
        "n",  # forced to 1
        "stream",  # a boolean
        "stream_options",  # replaced: include_usage forced on a stream, dropped otherwise
    }
)
TOKEN_FIELDS: Final = ("max_tokens", "max_completion_tokens")


class BodyRefused(ValueError):
    """The body cannot be forwarded; the message says why, for the agent."""


def rewrite(body: dict[str, Any], *, model: str, max_tokens: int) -> dict[str, Any]:
    """The body to send upstream: known fields only, `model` forced, `n` 1, the token fields at most `max_tokens`.

    A stream asks for usage (`stream_options.include_usage`); `wants_usage(body)` tells whether the agent did.

    Without either token field, `max_tokens` is set to the cap: the upstream's default may be the model's whole
    context.

    Raises:
        BodyRefused: an unknown field, a `stream` that is not a boolean, no message list, or a token field that is not
            a positive integer.
    """
    unknown = sorted(set(body) - FORWARDED_FIELDS)
    if unknown:
        raise BodyRefused(
            f"the farmhost LLM proxy does not forward {', '.join(map(repr, unknown[:8]))}; "
            f"send only these chat-completions fields: {', '.join(sorted(FORWARDED_FIELDS))}"
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BodyRefused("stream must be true or false")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise BodyRefused("messages must be a non-empty list")
    out = {name: value for name, value in body.items() if name not in ("stream", "stream_options")}
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    out["model"] = model
    out["n"] = 1
    present = False
    for name in TOKEN_FIELDS:
        if name in out and out[name] is not None:
            value = out[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BodyRefused(f"{name} must be a positive integer")
            out[name] = min(value, max_tokens)
            present = True
    if not present:
        out["max_tokens"] = max_tokens
    return out


def wants_usage(body: dict[str, Any]) -> bool:
    """The agent's own body asked for a stream's usage chunk (the proxy asks for it always, and relays it only then)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True
