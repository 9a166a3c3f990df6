"""Golden request and result files: the decoder accepts each request in its queue, the exported schema agrees."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args
from zoneinfo import ZoneInfo

import pytest
from ipc_schema import SCHEMA, errors, resolve

from farmhost.protocol.codes import ErrorCode, Queue, Status
from farmhost.protocol.decode import RequestRejected, decode_request
from farmhost.protocol.envelope import Outcome, envelope
from farmhost.protocol.requests import QUEUE_TYPES, FarmActionName, MemoryActionRequest, ScheduleTaskRequest
from farmhost.scheduler.specs import parse_schedule

FIXTURES = Path(__file__).parent / "fixtures"
# File names are `<queue>.<type>[.<variant>].json`; results are `result.<variant>.json`.
REQUESTS = sorted(p for p in FIXTURES.glob("*.json") if not p.name.startswith("result."))
RESULTS = sorted(FIXTURES.glob("result.*.json"))


def _load(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def _queue(path: Path) -> Queue:
    return Queue(path.name.split(".")[0])


def test_every_request_type_of_the_contract_has_a_golden_file() -> None:
    seen: set[tuple[str, str, str | None]] = set()
    for path in REQUESTS:
        doc = _load(path)
        seen.add((_queue(path).value, doc["type"], doc.get("action")))
    types = {(queue.value, kind) for queue, kinds in QUEUE_TYPES.items() for kind in kinds}
    assert {(queue, kind) for queue, kind, _ in seen} == types
    memory_actions = get_args(MemoryActionRequest.model_fields["action"].annotation)
    assert {action for _, kind, action in seen if kind == "farm_action"} == set(get_args(FarmActionName))
    assert {action for _, kind, action in seen if kind == "memory_action"} == set(memory_actions)
    assert len(RESULTS) >= 2


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.stem)
def test_golden_request_is_accepted_in_its_queue_only(path: Path) -> None:
    queue, raw = _queue(path), path.read_bytes()
    doc = _load(path)
    request = decode_request(queue, raw, stem=path.stem)
    assert request.type == doc["type"]
    assert request.requestId == doc["requestId"]
    assert request.action_name == doc.get("action")
    for other in Queue:
        if other is not queue:
            with pytest.raises(RequestRejected, match="unknown type"):
                decode_request(other, raw, stem=path.stem)


@pytest.mark.parametrize("path", REQUESTS, ids=lambda p: p.stem)
def test_golden_request_matches_the_exported_schema(path: Path) -> None:
    doc, queue = _load(path), _queue(path)
    assert errors(doc, f"/queues/{queue.value}") == []
    assert errors(doc) == []  # the root accepts anything of the contract
    for other in Queue:
        if other is not queue:
            assert errors(doc, f"/queues/{other.value}") != []


def test_golden_schedules_are_valid_schedules() -> None:
    zone = ZoneInfo("Europe/Lisbon")
    scheduled = [p for p in REQUESTS if _load(p)["type"] == "schedule_task"]
    assert {_load(p)["schedule_type"] for p in scheduled} == {"cron", "interval", "once"}
    for path in scheduled:
        request = decode_request(Queue.TASKS, path.read_bytes(), stem=path.stem)
        assert isinstance(request, ScheduleTaskRequest)
        parse_schedule(request.schedule_type, request.schedule_value, tz=zone)


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.stem)
def test_golden_result_matches_the_result_schema(path: Path) -> None:
    doc = _load(path)
    assert errors(doc, "/result") == []
    # The same, by hand, against the contract's own enums (SPEC section 4).
    result = resolve(SCHEMA["result"]["$ref"])
    assert set(doc) == set(result["required"]) == set(result["properties"])
    assert doc["status"] in {s.value for s in Status}
    if doc["status"] == "error":
        assert doc["errorCode"] in {c.value for c in ErrorCode}
        assert isinstance(doc["error"], str) and doc["error"]
        assert doc["result"] is None
    else:
        assert doc["errorCode"] is None and doc["error"] is None


def test_result_schema_refuses_what_the_contract_forbids() -> None:
    good = _load(FIXTURES / "result.error.json")
    bad_variants: list[dict[str, Any]] = [
        {**good, "errorCode": "kaput"},
        {**good, "status": "failed"},
        {**good, "durationMs": -1},
        {**good, "durationMs": 1.5},
        {**good, "executedAt": "yesterday"},
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "errorCode"},
    ]
    for bad in bad_variants:
        assert errors(bad, "/result") != [], bad


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (Outcome(result={"pong": True}), "success"),
        (Outcome.failure(ErrorCode.UNAUTHORIZED, "only main may do this"), "error"),
    ],
)
def test_the_envelope_the_host_writes_matches_the_result_schema(outcome: Outcome, status: str) -> None:
    doc = envelope(
        request_id="r-1",
        kind="farm_action",
        action="ha_get_status",
        outcome=outcome,
        executed_at=datetime(2026, 5, 17, 0, 0, 10, 123_000, tzinfo=UTC),
        duration_ms=12,
    )
    assert doc["status"] == status
    assert doc["executedAt"] == "2026-05-17T00:00:10.123Z"
    assert errors(json.loads(json.dumps(doc)), "/result") == []


GOOD = {
    "message": _load(FIXTURES / "messages.message.json"),
    "register": _load(FIXTURES / "tasks.register_group.json"),
    "schedule": _load(FIXTURES / "tasks.schedule_task.cron.json"),
    "ping": _load(FIXTURES / "actions.ping.json"),
    "farm": _load(FIXTURES / "actions.farm_action.ha_get_status.json"),
}
# What the decoder refuses, the schema refuses too: (queue, request, part of the decoder's sentence).
REFUSED: list[tuple[Queue, dict[str, Any], str]] = [
    (Queue.MESSAGES, {k: v for k, v in GOOD["message"].items() if k != "text"}, "missing field 'text'"),
    (Queue.MESSAGES, {**GOOD["message"], "chatJid": "no-colon"}, "chatJid"),
    (Queue.MESSAGES, {**GOOD["message"], "text": ""}, "text"),
    (Queue.MESSAGES, {**GOOD["message"], "grupFolder": "x"}, "unknown field 'grupFolder'"),
    (Queue.ACTIONS, {**GOOD["ping"], "requestId": "../x"}, "requestId must match"),
    (Queue.ACTIONS, {**GOOD["ping"], "ttl": 0}, "ttl"),
    (Queue.ACTIONS, {**GOOD["farm"], "action": "ha_shell"}, "action"),
    (Queue.ACTIONS, {**GOOD["ping"], "type": "pong"}, "unknown type 'pong'"),
    (Queue.TASKS, {**GOOD["schedule"], "schedule_type": "weekly"}, "schedule_type"),
    (Queue.TASKS, {**GOOD["schedule"], "context_mode": "shared"}, "context_mode"),
    (Queue.TASKS, {**GOOD["register"], "isMain": True}, "isMain cannot be set"),
    (Queue.TASKS, {**GOOD["register"], "folder": "../x"}, "is not valid"),
    (Queue.TASKS, {**GOOD["register"], "requiresTrigger": "yes"}, "requiresTrigger"),
]


@pytest.mark.parametrize(("queue", "doc", "reason"), REFUSED, ids=lambda v: v if isinstance(v, str) else "")
def test_decoder_and_schema_refuse_the_same_bad_requests(queue: Queue, doc: dict[str, Any], reason: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        decode_request(queue, json.dumps(doc).encode(), stem="bad-1")
    assert reason in refused.value.reason
    assert "Value error" not in refused.value.reason
    assert errors(doc, f"/queues/{queue.value}") != []
