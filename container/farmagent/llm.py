"""The chat-completions client: one POST of `/chat/completions` on the host's proxy socket (or a plain URL).

In the sandbox the LLM is reached only through farmhost's proxy on a Unix socket (FARMAGENT_LLM_SOCKET); the
proxy adds the real API key on the host side, so the key sent from here is a fixed, non-secret placeholder.
For development FARMAGENT_LLM_BASE_URL (e.g. `http://127.0.0.1:8080/v1`) is used directly instead.

Every agent run pays this module's import before the model starts, so it is the standard library's
`http.client` and `json` with typed answers of its own rather than the `openai` package (1.3 s to import
here, most of a run). What the runner needs of the protocol is small: a non-streaming completion, the first
choice's message with its tool calls, the error body's message, and the retries the openai client makes
(connection errors, 408, 409, 429 and 5xx unless `x-should-retry` says otherwise, backing off 0.5 s doubling
to 8 s, or as `retry-after-ms` / `retry-after` says, up to 60 s).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from farmagent.errors import LlmError

if TYPE_CHECKING:
    from farmagent.config import AgentSettings
    from farmagent.tools import ToolSpec

PLACEHOLDER_API_KEY: Final = "farmhost-proxy"  # not a secret: the proxy replaces it with the real key
PROXY_PATH: Final = "/v1"  # the proxy's base path on its Unix socket
RETRIED_STATUS: Final = frozenset({408, 409, 429})
MAX_ANSWER_BYTES: Final = 16 * 1024 * 1024
MAX_RETRY_WAIT: Final = 60.0


@dataclass(frozen=True)
class FunctionCall:
    """The function a tool call names, with its arguments as the model wrote them (JSON text, unchecked)."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message."""

    id: str
    type: str
    function: FunctionCall

    def to_message(self) -> dict[str, Any]:
        """The call as the assistant message's `tool_calls` entry sent back in the history."""
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.function.name, "arguments": self.function.arguments},
        }


@dataclass(frozen=True)
class AssistantMessage:
    """The first choice's message: its text and the tool calls it asks for."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the proxy's Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("farmhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ChatClient:
    """A chat-completions endpoint: where it is, how long to wait, how often to retry."""

    def __init__(self, settings: AgentSettings) -> None:
        """The endpoint of `settings`: its base URL if set, else the proxy socket."""
        self.timeout = settings.llm_timeout
        self.max_retries = settings.llm_max_retries
        self._socket: str | None = None
        if settings.llm_base_url is None:
            self._socket, self._scheme, self._netloc, self._path = str(settings.llm_socket), "http", "", PROXY_PATH
        else:
            url = urllib.parse.urlsplit(settings.llm_base_url)
            self._scheme, self._netloc, self._path = url.scheme, url.netloc, url.path.rstrip("/")

    def _connection(self) -> http.client.HTTPConnection:
        if self._socket is not None:
            return _UnixConnection(self._socket, self.timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._netloc, timeout=self.timeout)
        return http.client.HTTPConnection(self._netloc, timeout=self.timeout)

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """One POST of a JSON body; returns (status, lower-case headers, body). Raises OSError and http.client errors."""
        connection = self._connection()
        try:
            connection.request(
                "POST",
                self._path + path,
                body=body,
                headers={
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                    "Authorization": f"Bearer {PLACEHOLDER_API_KEY}",
                },
            )
            response = connection.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        finally:
            connection.close()


def where(settings: AgentSettings) -> str:
    """How error messages name the endpoint."""
    if settings.llm_base_url:
        return settings.llm_base_url
    return f"the host's LLM proxy ({settings.llm_socket})"


def tool_params(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools in the chat-completions `tools` format."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def complete(
    client: ChatClient,
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    endpoint: str,
) -> AssistantMessage:
    """One chat completion; returns the first choice's message.

    Raises:
        LlmError: unreachable, timed out, an HTTP error after the client's retries, or an answer without a choice.
    """
    document: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        document["tools"] = tools
    body = json.dumps(document).encode()  # once, however often it is sent
    attempt = 0
    while True:
        try:
            status, headers, data = client.post("/chat/completions", body)
        except TimeoutError:
            if attempt >= client.max_retries:
                raise LlmError(f"the LLM at {endpoint} did not answer in time ({client.timeout} s)") from None
            wait = _backoff(attempt, {})
        except (OSError, http.client.HTTPException) as err:
            if attempt >= client.max_retries:
                raise LlmError(f"cannot reach the LLM at {endpoint}: {_reason(err)}") from None
            wait = _backoff(attempt, {})
        else:
            if status < 300:
                return _message(data, endpoint)
            retried = _should_retry(status, headers)
            if not retried or attempt >= client.max_retries:
                raise LlmError(_status_message(status, data, endpoint, attempt if retried else 0)) from None
            wait = _backoff(attempt, headers)
        attempt += 1
        time.sleep(wait)


def _should_retry(status: int, headers: dict[str, str]) -> bool:
    # The proxy says `x-should-retry: false` for what cannot succeed (a spent budget), as OpenAI's API does.
    asked = headers.get("x-should-retry")
    if asked in ("true", "false"):
        return asked == "true"
    return status in RETRIED_STATUS or status >= 500


def _backoff(attempt: int, headers: dict[str, str]) -> float:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            asked = float(headers[name]) * scale
        except (KeyError, ValueError):
            continue
        if 0 <= asked <= MAX_RETRY_WAIT:
            return asked
    return min(0.5 * 2.0**attempt, 8.0) * (1 - 0.25 * random.random())  # jitter, not a secret


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


def _message(data: bytes, endpoint: str) -> AssistantMessage:
    unusable = f"the LLM at {endpoint} answered something unusable"
    if len(data) > MAX_ANSWER_BYTES:
        raise LlmError(f"{unusable}: more than {MAX_ANSWER_BYTES} bytes")
    try:
        answer = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LlmError(f"{unusable}: not JSON ({err})") from None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        raise LlmError(f"{unusable}: no `choices` list")
    if not choices:
        raise LlmError(f"the LLM at {endpoint} answered without any choice")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    if not isinstance(message, dict):
        raise LlmError(f"{unusable}: the first choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise LlmError(f"{unusable}: the message's content is not text")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise LlmError(f"{unusable}: tool_calls is not a list")
    return AssistantMessage(content=content, tool_calls=tuple(_tool_call(c, unusable) for c in raw_calls))


def _tool_call(raw: object, unusable: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(function, dict):
        raise LlmError(f"{unusable}: a tool call without a function")
    call_id, kind = raw.get("id"), raw.get("type", "function")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(call_id, str) or not isinstance(kind, str) or not isinstance(name, str):
        raise LlmError(f"{unusable}: a tool call needs a text id, type and function name")
    if arguments is not None and not isinstance(arguments, str):
        raise LlmError(f"{unusable}: a tool call's arguments must be JSON text")
    return ToolCall(id=call_id, type=kind, function=FunctionCall(name=name, arguments=arguments or ""))


def _status_message(code: int, data: bytes, endpoint: str, retries: int) -> str:
    text = data[:4096].decode("utf-8", "replace")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    error = body.get("error", body) if isinstance(body, dict) else None
    detail = error.get("message") if isinstance(error, dict) else None
    text = str(detail) if detail else text[:300] or http.client.responses.get(code, "")
    if code == 429 or code >= 500:
        return f"the LLM at {endpoint} failed with HTTP {code} (also after {retries} retries): {text}"
    return f"the LLM at {endpoint} refused the request with HTTP {code}: {text}"
