"""Turn the bytes of a request file into a validated request, or a specific reason it is refused."""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from farmhost.errors import InvalidRequest
from farmhost.protocol.catalog import ACTION_PARAMS
from farmhost.protocol.codes import REQUEST_ID_RE, Queue
from farmhost.protocol.field_errors import expectation, field_path
from farmhost.protocol.params import parse_params
from farmhost.protocol.requests import (
    QUEUE_TYPES,
    ActionsRequest,
    AnyRequest,
    FarmActionRequest,
    MemoryActionRequest,
    MessagesRequest,
    TasksRequest,
)

# An action name no row serves is kept this long for the audit line (it is the agent's text).
MAX_NAMED_CHARS: Final = 128
_ADAPTERS: Final[dict[Queue, TypeAdapter[Any]]] = {
    Queue.MESSAGES: TypeAdapter(MessagesRequest),
    Queue.TASKS: TypeAdapter(TasksRequest),
    Queue.ACTIONS: TypeAdapter(ActionsRequest),
}


class RequestRejected(ValueError):
    """A request file that cannot be executed; `request_id` is set when one could be recovered."""

    def __init__(
        self,
        reason: str,
        *,
        request_id: str | None = None,
        kind: str | None = None,
        action: str | None = None,
        params: Any = None,
        named: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id
        self.kind = kind
        self.action = action  # the `action` written, when it is one of the host's (the row told of the refusal)
        self.params = params  # the `params` written, as they are
        self.named = named if named is not None else action  # the `action` written, when it is text (for the audit)


def decode_request(queue: Queue, raw: bytes, *, stem: str) -> AnyRequest:
    """Validate `raw` as a request of `queue`.

    Args:
        queue: the queue directory the file was found in (it decides which types are allowed).
        raw: the file's bytes.
        stem: the file name without `.json`, the fallback requestId.

    Returns:
        The request, with `requestId` filled in from the stem when absent and the stem is a valid id.

    Raises:
        RequestRejected: with a sentence saying what is wrong.
    """
    try:
        request: AnyRequest = _ADAPTERS[queue].validate_json(raw)
    except ValidationError as err:
        raise _explain(queue, raw, stem, err) from None
    if request.requestId is None:
        fallback = stem if REQUEST_ID_RE.fullmatch(stem) else None
        request = request.model_copy(update={"requestId": fallback})
    _check_params(request)
    return request


def _check_params(request: AnyRequest) -> None:
    """Refuse an action whose params do not fit its model: a malformed file, quarantined (SPEC: wrong types).

    The same check as a wrong field of the request itself; the handler parses the params again into its model.
    """
    if not isinstance(request, FarmActionRequest | MemoryActionRequest):
        return
    try:
        parse_params(ACTION_PARAMS[request.action], request.params, request.action)
    except InvalidRequest as err:
        raise RequestRejected(
            err.message,
            request_id=request.requestId,
            kind=request.type,
            action=request.action,
            params=request.params,
        ) from None


def _explain(queue: Queue, raw: bytes, stem: str, err: ValidationError) -> RequestRejected:
    stem_id = stem if REQUEST_ID_RE.fullmatch(stem) else None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return RequestRejected("file is not valid UTF-8 text", request_id=stem_id)
    except RecursionError:
        return RequestRejected("JSON is nested too deeply", request_id=stem_id)
    except json.JSONDecodeError as exc:
        return RequestRejected(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", request_id=stem_id)
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit limit: must not escape as a host bug
        return RequestRejected(f"not valid JSON: {exc}", request_id=stem_id)
    if not isinstance(data, dict):
        return RequestRejected(f"a request must be a JSON object, got {type(data).__name__}", request_id=stem_id)
    raw_id = data.get("requestId")
    if raw_id is not None and not (isinstance(raw_id, str) and REQUEST_ID_RE.fullmatch(raw_id)):
        return RequestRejected(
            "requestId must match ^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$ (letters, digits, '_', '.', '-')",
            request_id=stem_id,
        )
    request_id = raw_id if isinstance(raw_id, str) else stem_id
    allowed = QUEUE_TYPES[queue]
    raw_kind = data.get("type")
    kind = raw_kind if isinstance(raw_kind, str) and raw_kind in allowed else None
    if kind is None:
        return RequestRejected(
            f"unknown type {raw_kind!r} for the {queue.value} queue (expected one of: {', '.join(allowed)})",
            request_id=request_id,
        )
    if kind == "register_group" and "isMain" in data:
        return RequestRejected(
            "isMain cannot be set through IPC; only the operator can choose the main group",
            request_id=request_id,
            kind=kind,
        )
    action = data.get("action")
    return RequestRejected(
        _first_error(err),
        request_id=request_id,
        kind=kind,
        action=action if isinstance(action, str) and action in ACTION_PARAMS else None,
        params=data.get("params"),
        named=action[:MAX_NAMED_CHARS] if isinstance(action, str) else None,
    )


def _first_error(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    first = errors[0]
    # The discriminator tag is the first element of the location; it tells nothing to the agent.
    skip = 1 if len(first["loc"]) > 1 else 0
    where = field_path(first, skip=skip)
    # "Value error, " is pydantic's prefix for a validator's own sentence.
    message = expectation(errors, skip=skip).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if first["type"] == "missing":
        return f"missing field {where!r}"
    return f"field {where!r}: {message}" if where else message
