"""The chat-completions client: the real `openai` client on the host's proxy socket (or a plain URL), errors mapped.

In the sandbox the LLM is reached only through farmhost's proxy on a Unix socket (FARMAGENT_LLM_SOCKET); the
proxy adds the real API key on the host side, so the key sent from here is a fixed, non-secret placeholder.
For development FARMAGENT_LLM_BASE_URL (e.g. `http://127.0.0.1:8080/v1`) is used directly instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import httpx2
import openai

from farmagent.errors import LlmError

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageParam, ChatCompletionToolParam

    from farmagent.config import AgentSettings
    from farmagent.tools import ToolSpec

PROXY_BASE_URL: Final = "http://farmhost/v1"  # the host part is ignored on a Unix socket
PLACEHOLDER_API_KEY: Final = "farmhost-proxy"  # not a secret: the proxy replaces it with the real key


def make_client(settings: AgentSettings) -> openai.OpenAI:
    """The openai client for this sandbox (retries of 429/5xx/connection errors per `llm_max_retries`)."""
    http_client = None
    base_url = settings.llm_base_url
    if base_url is None:
        http_client = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(settings.llm_socket)))
        base_url = PROXY_BASE_URL
    return openai.OpenAI(
        api_key=PLACEHOLDER_API_KEY,
        base_url=base_url,
        http_client=http_client,
        max_retries=settings.llm_max_retries,
        timeout=settings.llm_timeout,
    )


def where(settings: AgentSettings) -> str:
    """How error messages name the endpoint."""
    if settings.llm_base_url:
        return settings.llm_base_url
    return f"the host's LLM proxy ({settings.llm_socket})"


def tool_params(tools: Sequence[ToolSpec]) -> list[ChatCompletionToolParam]:
    """The tools in the chat-completions `tools` format."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def complete(
    client: openai.OpenAI,
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[ChatCompletionToolParam],
    endpoint: str,
) -> ChatCompletionMessage:
    """One chat completion; returns the first choice's message.

    Raises:
        LlmError: unreachable, timed out, an HTTP error after the client's retries, or an answer without a choice.
    """
    try:
        response = client.chat.completions.create(
            model=model,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            tools=tools if tools else openai.omit,
        )
    except openai.APITimeoutError:
        raise LlmError(f"the LLM at {endpoint} did not answer in time ({client.timeout} s)") from None
    except openai.APIConnectionError as err:
        cause = err.__cause__ or err
        raise LlmError(f"cannot reach the LLM at {endpoint}: {cause}") from None
    except openai.APIStatusError as err:
        raise LlmError(_status_message(err, endpoint, client.max_retries)) from None
    except openai.APIError as err:
        raise LlmError(f"the LLM at {endpoint} answered something unusable: {err.message}") from None
    if not response.choices:
        raise LlmError(f"the LLM at {endpoint} answered without any choice")
    return response.choices[0].message


def _status_message(err: openai.APIStatusError, endpoint: str, retries: int) -> str:
    body = err.body
    detail = body.get("message") if isinstance(body, dict) else None
    text = str(detail) if detail else err.response.text[:300] or err.message
    code = err.status_code
    if code == 429 or code >= 500:
        return f"the LLM at {endpoint} failed with HTTP {code} (also after {retries} retries): {text}"
    return f"the LLM at {endpoint} refused the request with HTTP {code}: {text}"
