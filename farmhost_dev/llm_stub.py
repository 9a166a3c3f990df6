"""A scripted OpenAI-compatible chat-completions server for tests and benchmarks (the stand-in for a hosted LLM).

A real HTTP server (`http.server.ThreadingHTTPServer` in a thread) on 127.0.0.1, or on a Unix socket,
answering like the OpenAI API, so the real `openai` client (and anything that forwards to it, such as
farmhost's LLM proxy) is exercised unchanged.

Endpoints:
    POST /v1/chat/completions   the next step of the script, as a `chat.completion` object
                                (choices[0].message.content / .tool_calls, finish_reason, usage) or an error;
                                with `stream: true`, as OpenAI streams it: `text/event-stream`, chunked, one
                                `chat.completion.chunk` per event (choices[0].delta: the role, then pieces of the
                                content, tool-call deltas by index with the id and name first and then pieces of
                                the arguments, then finish_reason), a usage chunk (choices []) when
                                `stream_options.include_usage`, then `data: [DONE]`
    GET  /v1/models             `{"object": "list", "data": [{"id": <model>, "object": "model", ...}]}`
    with `ollama=OllamaModel(...)`, Ollama's own API beside it, in Ollama's shapes (docs.ollama.com/api):
    POST /api/show              `{"model"}` -> license, modelfile, `parameters` (its text lines, `num_ctx N`
                                when the model sets one), template, details, `model_info` (general.architecture,
                                `<arch>.context_length`), capabilities; 404 `{"error": "model 'x' not found"}`
    GET  /api/ps                `{"models": [...]}`: the model with its `context_length` when it is loaded
    anything else               404 with an OpenAI error body (Ollama's own: `404 page not found`, text)

Usage:
    with ScriptedLLM([ToolCall("memory_search", {"query": "pump"}), Reply("All fine.")]) as llm:
        env["FARMAGENT_LLM_BASE_URL"] = llm.base_url          # http://127.0.0.1:<port>/v1
        ...
        assert llm.requests[1].last_tool_result() ...          # what the model was shown

    or, in the tests, the pytest fixture `llm_stub` (tests/llm_stub.py, registered in tests/conftest.py): a
    started, empty ScriptedLLM; give it steps with `llm_stub.script(step, ...)`.

Steps (each chat-completions request consumes one):
    Reply(text)                          a final answer (finish_reason "stop")
    ToolCall(name, arguments, id=None)   one function call (finish_reason "tool_calls"); arguments a dict
                                         (sent JSON-encoded, as OpenAI does) or a raw string (to send bad JSON)
    ToolCalls([ToolCall, ...], text=None) several calls in one answer
    Fail(status, message, ...)           an HTTP error with OpenAI's body {"error": {message, type, param, code}};
                                         `retry_after_ms` adds the header the openai client honours,
                                         `should_retry` the `x-should-retry` header
    Raw(body, status=200, delay=0.0)     these bytes as the body, after `delay` s (an unusable or late answer)
    Streamed(step, chunk_chars=8, hold_after=None, release=Event(), cut_after=None, usage=True, pace=0.0)
                                         how a step streams (a plain step streams with these defaults):
                                         `chunk_chars` per piece; after `hold_after` events the stub waits for
                                         `release.set()`; after `cut_after` events it drops the connection
                                         mid-body; `usage=False` sends no usage chunk even when asked; `pace`
                                         seconds between events
    a callable(Recorded) -> step         decided on the request it answers (e.g. on the last tool result)
When the script is exhausted, `then` answers (constructor argument; default Fail(500, "script exhausted")),
so an endless tool-calling model is `ScriptedLLM(then=ToolCall("ping", {}))`.

Every request's method and path is in `llm.paths`, in arrival order (what a host asked beside the completions).
Recorded requests (`llm.requests`, in arrival order, chat completions only): `body` (the parsed JSON),
`headers` (lower-case names, e.g. "authorization"), and the shortcuts `messages`, `tools`, `tool_names`,
`model`, `system` (the system prompt text), `last_tool_result()` and `text()` (all message text joined).
`llm.wait_requests(n)` blocks until n requests arrived. `llm.usages` lists the `usage` the stub reported, one
per answer (streamed ones only when it sent a usage chunk); `llm.events_sent` counts the stream events written.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeAlias

from farmhost_dev.testing import scaled


@dataclass(frozen=True)
class Reply:
    """A final answer."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One function call; `arguments` is JSON-encoded unless it is already a string."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ToolCalls:
    """Several function calls in one assistant message (with optional text)."""

    calls: list[ToolCall]
    text: str | None = None


@dataclass(frozen=True)
class Fail:
    """An HTTP error with an OpenAI-shaped error body."""

    status: int
    message: str = "the stub was told to fail"
    type: str = "server_error"
    code: str | None = None
    retry_after_ms: int | None = None
    should_retry: bool | None = None


@dataclass(frozen=True)
class Raw:
    """Bytes sent as they are, after `delay` seconds: an answer no OpenAI server would give, or none in time."""

    body: bytes
    status: int = 200
    delay: float = 0.0


@dataclass(frozen=True)
class Streamed:
    """How a step is streamed to a `stream: true` request."""

    step: Reply | ToolCall | ToolCalls
    chunk_chars: int = 8
    hold_after: int | None = None
    release: threading.Event = field(default_factory=threading.Event, compare=False)
    cut_after: int | None = None
    usage: bool = True
    pace: float = 0.0


@dataclass(frozen=True)
class OllamaModel:
    """What the stub says of its model when it stands in for Ollama (`ScriptedLLM(ollama=...)`)."""

    architecture: str = "qwen2"
    trained_context: int = 32768  # `<architecture>.context_length` in /api/show's model_info
    num_ctx: int | None = None  # a `PARAMETER num_ctx` of the model's Modelfile: a line of /api/show's parameters
    loaded_context: int | None = None  # /api/ps lists the model loaded with this context (None: not loaded)

    def show(self, name: str) -> dict[str, Any]:
        """`POST /api/show`'s answer."""
        parameters = [f"num_ctx                        {self.num_ctx}"] if self.num_ctx is not None else []
        parameters += ['stop                           "<|im_start|>"', 'stop                           "<|im_end|>"']
        details = {"parent_model": "", "format": "gguf", "family": self.architecture, "families": [self.architecture],
                   "parameter_size": "1.5B", "quantization_level": "Q4_K_M"}  # fmt: skip
        return {
            "license": "Apache License 2.0",
            "modelfile": '# Modelfile generated by "ollama show"\nFROM /models/blobs/sha256-0\n',
            "parameters": "\n".join(parameters),
            "template": "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}",
            "details": details,
            "model_info": {
                "general.architecture": self.architecture,
                "general.parameter_count": 1543714304,
                f"{self.architecture}.block_count": 28,
                f"{self.architecture}.context_length": self.trained_context,
                f"{self.architecture}.embedding_length": 1536,
            },
            "capabilities": ["completion", "tools"],
            "modified_at": "2026-11-30T08:00:00.000000000Z",
        }

    def ps(self, name: str) -> dict[str, Any]:
        """`GET /api/ps`'s answer."""
        if self.loaded_context is None:
            return {"models": []}
        details = self.show(name)["details"]
        loaded = {"name": name, "model": name, "size": 1_900_000_000, "digest": "0" * 64, "details": details,
                  "expires_at": "2026-12-06T21:00:00Z", "size_vram": 0, "context_length": self.loaded_context}  # fmt: skip
        return {"models": [loaded]}


@dataclass(frozen=True)
class Recorded:
    """One chat-completions request as the stub received it."""

    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's messages."""
        return list(self.body.get("messages") or [])

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The request's tools."""
        return list(self.body.get("tools") or [])

    @property
    def tool_names(self) -> list[str]:
        """The names of the offered function tools."""
        return [t["function"]["name"] for t in self.tools if t.get("type") == "function"]

    @property
    def model(self) -> str | None:
        """The requested model."""
        return self.body.get("model")

    @property
    def system(self) -> str:
        """The text of the system message(s)."""
        return "\n".join(_text(m) for m in self.messages if m.get("role") in ("system", "developer"))

    def last_tool_result(self) -> str | None:
        """The content of the last `tool` message, if any."""
        results = [_text(m) for m in self.messages if m.get("role") == "tool"]
        return results[-1] if results else None

    def text(self) -> str:
        """Every message's text content, joined (for "does the model see X anywhere" assertions)."""
        return "\n".join(_text(m) for m in self.messages)


Answer: TypeAlias = Reply | ToolCall | ToolCalls | Fail | Raw | Streamed  # what a step is once resolved
Step: TypeAlias = Answer | Callable[[Recorded], Any]


def pump_state_reply(request: Recorded) -> Reply:
    """A step that answers with the switched entity's state from the last tool result (`ha_set_entity`'s)."""
    result = json.loads(request.last_tool_result() or "{}")
    return Reply(f"Done: the irrigation pump is {result['state']['state']}.")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


class ScriptedLLM:
    """The server. Start it with `with` (or `start()`/`close()`)."""

    def __init__(
        self,
        steps: Iterable[Step] = (),
        *,
        then: Step | None = None,
        model: str = "stub-model",
        unix_socket: Path | str | None = None,
        ollama: OllamaModel | None = None,
    ) -> None:
        self._steps: list[Step] = list(steps)
        self.ollama = ollama
        self.paths: list[str] = []
        self.then: Step = then if then is not None else Fail(500, "the stub's script is exhausted")
        self.model = model
        self.requests: list[Recorded] = []
        self.usages: list[dict[str, int]] = []
        self.events_sent = 0
        self._lock = threading.Condition()
        self._unix_socket = str(unix_socket) if unix_socket is not None else None
        self._server: socketserver.BaseServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def on_tcp(self) -> bool:
        """Served on 127.0.0.1 (not on a Unix socket)."""
        return self._unix_socket is None

    # lifecycle -----------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind and serve in a background thread."""
        handler = _handler(self)
        if self._unix_socket is not None:
            self._server = _UnixHTTPServer(self._unix_socket, handler)
        else:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="llm-stub", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>/v1` (for a Unix socket: `http://llm-stub/v1`, to use with a uds transport)."""
        assert self._server is not None, "start the stub first"
        if self._unix_socket is not None:
            return "http://llm-stub/v1"
        address = self._server.server_address
        assert isinstance(address, tuple)
        host, port = address[:2]
        return f"http://{host}:{port}/v1"

    # script --------------------------------------------------------------------------------------

    def script(self, *steps: Step, then: Step | None = None) -> Self:
        """Append steps (and optionally replace what answers after them)."""
        with self._lock:
            self._steps.extend(steps)
            if then is not None:
                self.then = then
        return self

    def wait_requests(self, count: int, timeout: float = 10.0) -> list[Recorded]:
        """Block until `count` chat-completions requests arrived (`timeout` scaled); returns them."""
        deadline = time.monotonic() + scaled(timeout)
        with self._lock:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the LLM stub got {len(self.requests)} requests, expected {count}")
                self._lock.wait(left)
            return list(self.requests)

    def take_step(self, recorded: Recorded) -> Answer:
        """Record a request and return the step that answers it (a callable step is resolved)."""
        with self._lock:
            self.requests.append(recorded)
            self._lock.notify_all()
            step = self._steps.pop(0) if self._steps else self.then
        while callable(step):
            step = step(recorded)
        return step

    # answers -------------------------------------------------------------------------------------

    def completion(self, request: dict[str, Any], step: Reply | ToolCall | ToolCalls) -> dict[str, Any]:
        """A `chat.completion` object for a step."""
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if isinstance(step, Reply):
            message["content"] = step.text
            finish = "stop"
        else:
            calls = step.calls if isinstance(step, ToolCalls) else [step]
            message["content"] = step.text if isinstance(step, ToolCalls) else None
            message["tool_calls"] = [_call(call) for call in calls]
            finish = "tool_calls"
        prompt_tokens = max(1, len(json.dumps(request.get("messages", []))) // 4)
        completion_tokens = max(1, len(json.dumps(message)) // 4)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {
            "id": f"chatcmpl-{secrets.token_hex(8)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": usage,
            "system_fingerprint": None,
        }

    def chunks(self, request: dict[str, Any], streamed: Streamed) -> list[dict[str, Any]]:
        """The `chat.completion.chunk` objects streaming a step, as OpenAI sends them (the usage chunk last)."""
        whole = self.completion(request, streamed.step)
        message, finish = whole["choices"][0]["message"], whole["choices"][0]["finish_reason"]
        size = max(1, streamed.chunk_chars)

        def pieces(text: str) -> list[str]:
            return [text[i : i + size] for i in range(0, len(text), size)]

        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "", "refusal": None}]
        deltas += [{"content": piece} for piece in pieces(message["content"] or "")]
        for index, call in enumerate(message.get("tool_calls") or []):
            function = {"name": call["function"]["name"], "arguments": ""}
            deltas.append(
                {"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": function}]}
            )
            deltas += [
                {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                for piece in pieces(call["function"]["arguments"])
            ]
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        base = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"]}
        base |= {"model": whole["model"], "system_fingerprint": None}
        if include_usage:
            base["usage"] = None
        choices = [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None} for delta in deltas]
        choices.append({"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None})
        out = [base | {"choices": [choice]} for choice in choices]
        if include_usage and streamed.usage:
            out.append(base | {"choices": [], "usage": whole["usage"]})
        return out


def _call(call: ToolCall) -> dict[str, Any]:
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return {
        "id": call.id or f"call_{secrets.token_hex(6)}",
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _error_body(message: str, type_: str = "invalid_request_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _StubHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests from `stub`'s script."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    stub: ScriptedLLM  # set on the subclass each server gets

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, document: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send_bytes(status, json.dumps(document).encode(), headers)

    def _send_bytes(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []  # a forwarding proxy may stream the body in chunks
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers up to the blank line
            pass
        return b"".join(chunks)

    def do_GET(self) -> None:
        self.stub.paths.append(f"GET {self.path}")
        ollama = self.stub.ollama
        if ollama is not None and self.path == "/api/ps":
            self._send(200, ollama.ps(self.stub.model))
        elif self.path.rstrip("/") == "/v1/models":
            model = {"id": self.stub.model, "object": "model", "created": 0, "owned_by": "llm-stub"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._send(404, _error_body(f"no route GET {self.path}"))

    def do_POST(self) -> None:
        raw = self._body()
        self.stub.paths.append(f"POST {self.path}")
        if self.stub.ollama is not None and self.path == "/api/show":
            self._show(raw, self.stub.ollama)
            return
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, _error_body(f"no route POST {self.path}"))
            return
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self._send(400, _error_body("the body is not a JSON object"))
            return
        step = self.stub.take_step(Recorded(body=body, headers={k.lower(): v for k, v in self.headers.items()}))
        if isinstance(step, Fail):
            headers = {"retry-after-ms": str(step.retry_after_ms)} if step.retry_after_ms is not None else {}
            if step.should_retry is not None:
                headers["x-should-retry"] = str(step.should_retry).lower()
            self._send(step.status, _error_body(step.message, step.type, step.code), headers)
        elif isinstance(step, Raw):
            time.sleep(step.delay)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client that gave up waiting
                self._send_bytes(step.status, step.body)
        elif body.get("stream"):
            self._stream(body, step if isinstance(step, Streamed) else Streamed(step))
        else:
            answer = self.stub.completion(body, step.step if isinstance(step, Streamed) else step)
            self.stub.usages.append(answer["usage"])
            self._send(200, answer)

    def _show(self, raw: bytes, ollama: OllamaModel) -> None:
        try:
            name = json.loads(raw).get("model")
        except (ValueError, AttributeError):
            name = None
        if name != self.stub.model:
            self._send(404, {"error": f"model '{name}' not found"})
        else:
            self._send(200, ollama.show(name))

    def _stream(self, body: dict[str, Any], streamed: Streamed) -> None:
        chunks = self.stub.chunks(body, streamed)
        events = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]
        if chunks[-1].get("usage"):
            self.stub.usages.append(chunks[-1]["usage"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for sent, event in enumerate(events):
                if sent == streamed.cut_after:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: no terminating chunk
                    self.close_connection = True
                    return
                if sent == streamed.hold_after:
                    streamed.release.wait(timeout=scaled(60))
                elif sent and streamed.pace:
                    time.sleep(streamed.pace)
                with self.stub._lock:  # counted before it is written: a reader must never see more than the count
                    self.stub.events_sent += 1
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the proxy cut the stream
            self.close_connection = True


def _handler(stub: ScriptedLLM) -> type[BaseHTTPRequestHandler]:
    # On TCP, headers and body go out in two writes: with Nagle's algorithm the body waited for the client's
    # delayed ACK on a kept-alive connection, 40 ms per answer (real servers, llama.cpp's among them, set
    # TCP_NODELAY too). A Unix socket has no such option.
    return type("Handler", (_StubHandler,), {"stub": stub, "disable_nagle_algorithm": stub.on_tcp})
