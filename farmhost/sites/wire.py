"""What sites say to each other over MQTT: the topics and the two messages, a call and its answer.

A call goes to `farmhost/<target>/rpc/<origin>/request` and its answer to `farmhost/<origin>/rpc/<target>/answer`.
The sender is the topic level the broker's ACL ties to the sender's login (each site's own `user` block may write
only `farmhost/+/rpc/<its name>/...`), never a field of the payload, so one site cannot speak for another. Both messages are strict JSON documents of
bounded size; anything else is dropped with a log line (or answered `invalid_request` when it names its id).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, StringConstraints, ValidationError, field_validator

from farmhost.protocol.codes import SITE_RE, ErrorCode, Status
from farmhost.protocol.field_errors import expectation, field_path

VERSION: Final = 1
# A call carries one IPC request (at most FARMHOST_IPC_MAX_REQUEST_BYTES, 1 MiB by default); an answer one
# result document. Anything bigger is not a farmhost message.
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
# The furthest deadline a site gives a call (the request's own ttl/expiresAt is cut to it): a call is worth running
# minutes after it was asked, not hours, and a target refuses a deadline further away than this.
MAX_DEADLINE_SECONDS: Final = 600.0
AVAILABILITY_ALL: Final = "farmhost/+/availability"
CALL_ID_PATTERN: Final = r"^[0-9a-f]{32}$"

CallId = Annotated[str, StringConstraints(pattern=CALL_ID_PATTERN)]


class BadMessage(ValueError):
    """A message that is not a farmhost call or answer; `call_id` when it named one, `request` when it held one."""

    def __init__(self, reason: str, call_id: str | None = None, request: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.call_id = call_id
        self.request = request


class Call(BaseModel):
    """A farm action for the target site: run it once by `id`, not after `deadline`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: Literal[1]
    id: CallId
    deadline: datetime
    request: dict[str, Any]


class Answer(BaseModel):
    """The target site's result document for the call `id`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: Literal[1]
    id: CallId
    result: dict[str, Any]


class RemoteResult(BaseModel):
    """The part of the target's result document the origin uses."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Status
    result: Any = None
    error: str | None = None
    errorCode: str | None = None


class _Deadline(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    deadline: AwareDatetime

    @field_validator("deadline")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # in UTC from here on: a time no UTC clock can show (9999-12-31T23:59:59-14:00) is refused here, not
        # wherever it is first compared or shown
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("a time between the years 1 and 9999 in UTC") from None


def request_topic(target: str, origin: str) -> str:
    """Where `origin` sends its calls for `target`."""
    return f"farmhost/{target}/rpc/{origin}/request"


def answer_topic(origin: str, target: str) -> str:
    """Where `target` answers the calls of `origin`."""
    return f"farmhost/{origin}/rpc/{target}/answer"


def calls_for(site: str) -> str:
    """The subscription of a site's incoming calls."""
    return request_topic(site, "+")


def answers_for(site: str) -> str:
    """The subscription of the answers to a site's calls."""
    return answer_topic(site, "+")


def sender_of(topic: str) -> str | None:
    """The sending site of a call or answer topic (`farmhost/<to>/rpc/<from>/...`), None if it is not one."""
    levels = topic.split("/")
    if len(levels) != 5 or levels[0] != "farmhost" or levels[2] != "rpc":
        return None
    return levels[3] if SITE_RE.fullmatch(levels[3]) else None


def site_of_availability(topic: str) -> str | None:
    """The site of `farmhost/<site>/availability`, None if it is not one."""
    levels = topic.split("/")
    if len(levels) != 3 or levels[0] != "farmhost" or levels[2] != "availability":
        return None
    return levels[1] if SITE_RE.fullmatch(levels[1]) else None


def encode(message: Call | Answer) -> str:
    """The JSON text of a message."""
    return message.model_dump_json()


def decode_call(payload: bytes) -> Call:
    """A call from the wire.

    Raises:
        BadMessage: with the reason, and the call's id when it had a readable one.
    """
    document = _document(payload)
    call_id = _call_id(document)
    try:
        deadline = _Deadline.model_validate({"deadline": document.get("deadline")}).deadline
        return Call.model_validate({**document, "deadline": deadline})
    except ValidationError as err:
        request = document.get("request")
        raise BadMessage(_first_error(err), call_id, request if isinstance(request, dict) else None) from None


def decode_answer(payload: bytes) -> tuple[Answer, RemoteResult]:
    """An answer from the wire and the result document it carries.

    Raises:
        BadMessage: with the reason, and the call's id when it had a readable one.
    """
    document = _document(payload)
    call_id = _call_id(document)
    try:
        answer = Answer.model_validate(document)
        return answer, RemoteResult.model_validate(answer.result)
    except ValidationError as err:
        raise BadMessage(_first_error(err), call_id) from None


def error_code(raw: str | None) -> ErrorCode:
    """A remote `errorCode` as this site knows it (a code it does not know is an upstream error)."""
    try:
        return ErrorCode(raw or "")
    except ValueError:
        return ErrorCode.UPSTREAM_ERROR


def _document(payload: bytes) -> dict[str, Any]:
    if len(payload) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"the message has {len(payload)} bytes; at most {MAX_MESSAGE_BYTES} are read")
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError) as err:  # also an integer past Python's 4300 digits, not only bad JSON
        raise BadMessage(f"the message is not JSON: {err}") from None
    if not isinstance(document, dict):
        raise BadMessage("the message is not a JSON object")
    return document


def _call_id(document: dict[str, Any]) -> str | None:
    value = document.get("id")
    return (
        value if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value) else None
    )


def _first_error(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    return f"{field_path(errors[0]) or 'message'}: {expectation(errors)}"
