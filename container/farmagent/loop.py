"""The tool-calling loop: ask the model, run the tools it calls, hand back their results, until it answers.

One turn is one chat completion. A tool that fails (bad arguments, a refusal by the host, a stopped host)
returns its error to the model as the tool result, so the model can recover; only the LLM itself failing
ends the run with an error. The loop stops with an error after `max_turns` turns without a final answer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from farmagent.budget import estimate, prompt_limit
from farmagent.errors import LlmError
from farmagent.llm import complete
from farmagent.tools import ToolOutcome

if TYPE_CHECKING:
    from farmagent.llm import AssistantMessage, ChatClient, ToolCall
    from farmagent.prompt import RunContext
    from farmagent.toolbox import Toolbox
    from farmagent.tools import ToolContext

logger = logging.getLogger(__name__)

# A tool result is cut here before it goes to the model: a 2000-line memory_get or every HA state would
# otherwise fill a small model's whole context.
MAX_TOOL_RESULT_CHARS: Final = 16_000


@dataclass(kw_only=True)
class LoopOutcome:
    """How the loop ended, and the messages it added (the user prompt first)."""

    status: Literal["ok", "error"]
    answer: str | None = None
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    added: list[dict[str, Any]] = field(default_factory=list)
    llm_seconds: float = 0.0  # waiting for the model (through the proxy), all turns
    tool_seconds: float = 0.0  # running the tools (mostly waiting for the host's answers)

    def log_timing(self) -> None:
        """One log line saying where the run's time went, for the run log."""
        logger.info(
            "timing: %d LLM request(s) in %.0f ms, %d tool call(s) in %.0f ms",
            self.turns,
            self.llm_seconds * 1000,
            self.tool_calls,
            self.tool_seconds * 1000,
        )


@dataclass(frozen=True, kw_only=True)
class LoopParams:
    """What one run of the loop needs besides the clients."""

    model: str
    system: str
    history: list[dict[str, Any]]
    context: RunContext  # sent ahead of the prompt, not kept in the conversation
    prompt: str
    tools: Toolbox
    max_turns: int
    endpoint: str
    images: tuple[str, ...] = ()  # data URLs of the host's photos: image parts of the prompt's message
    context_tokens: int | None = None  # the endpoint's context size; None: unknown, nothing is trimmed


def user_message(prompt: str, images: tuple[str, ...]) -> dict[str, Any]:
    """The prompt's message as the model gets it: its text, then each image as an OpenAI image part."""
    if not images:
        return {"role": "user", "content": prompt}
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [{"type": "text", "text": prompt}, *parts]}


def run_loop(llm: ChatClient, tools: ToolContext, params: LoopParams) -> LoopOutcome:
    """Run the conversation to a final answer, an LLM error, or the turn limit.

    `added` (what a group's conversation keeps) starts with the prompt's text as the first request sent it, the
    run's section ahead of it, so the next run's requests begin with the same bytes as this run's (a server's
    prompt cache then covers this exchange); the images go with the prompt in every request of the run but are
    not kept: the next run's requests would otherwise carry every earlier photo.
    """
    outcome = LoopOutcome(status="error", added=[{"role": "user", "content": params.prompt}])
    offered = params.tools.params()
    names = params.tools.names()
    fit = _Fit(params, offered)
    while outcome.turns < params.max_turns:
        outcome.turns += 1
        asked = time.monotonic()
        try:
            messages = fit.messages(outcome.added)
            if outcome.turns == 1:
                outcome.added[0] = {"role": "user", "content": fit.sent_prompt()}
            message = complete(llm, model=params.model, messages=messages, tools=offered, endpoint=params.endpoint)
        except LlmError as err:
            outcome.error = err.message
            return outcome
        finally:
            outcome.llm_seconds += time.monotonic() - asked
        calls = message.tool_calls
        outcome.added.append(_assistant(message))
        if not calls:
            outcome.status, outcome.answer = "ok", (message.content or "").strip() or None
            logger.info("turn %d: final answer (%d characters)", outcome.turns, len(outcome.answer or ""))
            return outcome
        for call in calls:
            outcome.tool_calls += 1
            called = time.monotonic()
            result = _run_call(tools, call, params.tools, names)
            outcome.tool_seconds += time.monotonic() - called
            outcome.added.append({"role": "tool", "tool_call_id": call.id, "content": _cut(result.text)})
    outcome.error = (
        f"turn limit reached: {params.max_turns} turns without a final answer "
        f"({outcome.tool_calls} tool calls made); raise maxTurns or simplify the request"
    )
    return outcome


def _assistant(message: AssistantMessage) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        entry["tool_calls"] = [call.to_message() for call in message.tool_calls]
    return entry


def _run_call(tools: ToolContext, call: ToolCall, box: Toolbox, names: set[str]) -> ToolOutcome:
    started = time.monotonic()
    if call.type != "function":
        outcome = _refusal(f"only function tools exist here, not {call.type!r}")
        name = "?"
    else:
        name = call.function.name
        outcome = _call_function(tools, name, call.function.arguments, box, names)
    logger.info(
        "tool %s: %s in %.0f ms",
        name,
        "error " + outcome.text[:200] if outcome.is_error else "ok",
        (time.monotonic() - started) * 1000,
    )
    return outcome


def _call_function(
    tools: ToolContext, name: str, raw_arguments: str | None, box: Toolbox, names: set[str]
) -> ToolOutcome:
    if name not in names:
        return _refusal(f"there is no tool {name!r} in this run; tools: {', '.join(sorted(names))}")
    try:
        arguments = json.loads(raw_arguments or "{}")
    except json.JSONDecodeError as err:
        return _refusal(f"the arguments are not valid JSON ({err}); send a JSON object")
    if not isinstance(arguments, dict):
        return _refusal("the arguments must be a JSON object")
    return box.call(tools, name, arguments)


class _Fit:
    """The messages of each request, trimmed to the context.

    The oldest history goes first, then the memory hits, then the group's memory; each drop is said once in
    the run log. A run whose own messages do not fit ends with an error rather than a prompt the server
    would truncate.
    """

    def __init__(self, params: LoopParams, offered: list[dict[str, Any]]) -> None:
        self.params, self.offered = params, offered
        self.system = {"role": "system", "content": params.system}
        self.history = list(params.history)
        self.snippets = self.memory = True
        self.limit = None if params.context_tokens is None else prompt_limit(params.context_tokens)

    def sent_prompt(self) -> str:
        """The prompt's text as the request sends it: the run's section ahead of it (without the group's memory)."""
        return f"{self.params.context.text(snippets=self.snippets)}{self.params.prompt}"

    def messages(self, added: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The request's messages: system, history, the prompt with the run's section ahead of it, this run's turns.

        The group's memory goes ahead of the first user message (the oldest of the history, or the prompt).

        Raises:
            LlmError: even without history and memory the request would not fit.
        """
        dropped: list[str] = []
        needed, kept = 0, len(self.history)
        while True:
            first = user_message(self.params.prompt, self.params.images)  # the photos go in every request
            prompt = _with_context(first, self.params.context.text(snippets=self.snippets))
            turns = [*self.history, prompt]
            if self.memory and self.params.context.memory:
                turns[0] = _with_context(turns[0], self.params.context.memory_head())
            messages = [self.system, *turns, *added[1:]]
            if self.limit is None:
                return messages
            need = estimate(messages, self.offered)
            needed = needed or need
            if need <= self.limit:
                if kept > len(self.history):
                    dropped.insert(0, f"the {kept - len(self.history)} oldest history message(s)")
                if dropped:
                    logger.info(
                        "context: dropped %s: the request needed about %d tokens, %d may be sent to the model's "
                        "%d-token context; now about %d",
                        ", ".join(dropped),
                        needed,
                        self.limit,
                        self.params.context_tokens,
                        need,
                    )
                return messages
            if not self._drop(dropped):
                raise LlmError(
                    f"the request needs about {need} tokens, more than the {self.limit} this run may send to the "
                    f"model's {self.params.context_tokens}-token context (even without history and memory); "
                    "use a model with a larger context (FARMHOST_LLM_CONTEXT_TOKENS) or a shorter request"
                )

    def _drop(self, dropped: list[str]) -> bool:
        """Drop the next thing in line (memory parts said in `dropped`); False when nothing is left to drop."""
        if self.history:
            count = 1
            while count < len(self.history) and self.history[count]["role"] != "user":
                count += 1
            del self.history[:count]
        elif self.snippets and self.params.context.snippets:
            self.snippets = False
            dropped.append("the memory hits")
        elif self.memory and self.params.context.memory:
            self.memory = False
            dropped.append("the group's memory (MEMORY.md)")
        else:
            return False
        return True


def _with_context(message: dict[str, Any], context: str) -> dict[str, Any]:
    """The user's message with the run's section ahead of its text (the first text part's, for a list of parts)."""
    content = message.get("content")
    if isinstance(content, list):
        first, *rest = content
        return {**message, "content": [{**first, "text": f"{context}{first['text']}"}, *rest]}
    return {**message, "content": f"{context}{content or ''}"}


def _refusal(error: str) -> ToolOutcome:
    return ToolOutcome(is_error=True, text=json.dumps({"errorCode": "invalid_request", "error": error}))


def _cut(text: str) -> str:
    if len(text) <= MAX_TOOL_RESULT_CHARS:
        return text
    return f"{text[:MAX_TOOL_RESULT_CHARS]}\n[cut: {len(text) - MAX_TOOL_RESULT_CHARS} more characters]"
