"""The farm audit log: one line per farm action whatever its outcome, secrets redacted, rotated by size."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ha_core_support import farm_host, make_data_dir
from ha_fixture import HaInstance

from farmhost.farm.audit import AUDIT_FILE, MAX_ITEMS, MAX_STRING_CHARS, REDACTED, AuditLog, scrub
from farmhost.protocol.codes import ErrorCode

AT = datetime(2026, 5, 17, 6, 30, 1, 250_000, tzinfo=UTC)
KEYS = {"ts", "group", "requestId", "action", "params", "status", "errorCode", "durationMs"}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_record_shape(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "farm-state", max_bytes=1 << 20)
    audit.record(
        at=AT, group="main", request_id="r-1", action="ha_get_status", params={}, error_code=None, duration_ms=12
    )
    params = {"entityId": "switch.pump", "value": "on"}
    audit.record(
        at=AT, group="field", request_id="r-2", action="ha_set_entity", params=params,
        error_code=ErrorCode.UNAUTHORIZED, duration_ms=0,
    )  # fmt: skip
    audit.close()
    first, second = lines(tmp_path / "farm-state" / AUDIT_FILE)
    assert first == {
        "ts": "2026-05-17T06:30:01.250Z",
        "group": "main",
        "requestId": "r-1",
        "action": "ha_get_status",
        "params": {},
        "status": "success",
        "errorCode": None,
        "durationMs": 12,
    }
    assert set(second) == KEYS and second["status"] == "error" and second["errorCode"] == "unauthorized"
    assert second["params"] == params


def test_secrets_are_redacted_and_bulk_trimmed() -> None:
    params = {
        "domain": "notify",
        "data": {
            "message": "x" * (MAX_STRING_CHARS + 100),
            "api_key": "k-123",
            "nested": [{"Password": "hunter2", "keep": 1}, {"auth_token": ["t"]}],
            "Authorization": "Bearer abc",
            "client_secret": {"deep": 1},
        },
        "items": list(range(MAX_ITEMS + 5)),
    }
    clean = scrub(params)
    text = json.dumps(clean)
    for secret in ("k-123", "hunter2", "Bearer abc", '"t"', "deep"):
        assert secret not in text
    assert clean["data"]["api_key"] == REDACTED and clean["data"]["nested"][0] == {"Password": REDACTED, "keep": 1}
    assert clean["data"]["message"].endswith(f"...[{MAX_STRING_CHARS + 100} chars]")
    assert len(clean["data"]["message"]) < MAX_STRING_CHARS + 30
    assert clean["items"][-1] == "[5 more]" and len(clean["items"]) == MAX_ITEMS + 1
    assert params["data"]["api_key"] == "k-123", "the request's own params are not changed"


def test_rotates_by_size(tmp_path: Path) -> None:
    state = tmp_path / "farm-state"
    audit = AuditLog(state, max_bytes=4096)
    for n in range(120):
        audit.record(
            at=AT, group="main", request_id=f"r-{n:03d}", action="ha_get_status",
            params={"domains": ["sensor"] * 10}, error_code=None, duration_ms=n,
        )  # fmt: skip
    audit.close()
    files = sorted(p.name for p in state.iterdir())
    assert files == [AUDIT_FILE, *(f"{AUDIT_FILE}.{n}" for n in range(1, 6))], files
    assert all(p.stat().st_size <= 4096 for p in state.iterdir())
    assert lines(state / AUDIT_FILE)[-1]["requestId"] == "r-119"
    kept = [r["requestId"] for name in [*reversed(files[1:]), files[0]] for r in lines(state / name)]
    assert kept == sorted(kept) and kept[-1] == "r-119", "the newest lines are kept, in order"


async def test_every_outcome_is_audited_and_the_token_stays_out(tmp_path: Path, ha_reset: HaInstance) -> None:
    data_dir = make_data_dir(tmp_path / "data")
    async with farm_host(data_dir, ha_env=ha_reset.env()) as host:
        cases = [
            ("main", "ha_get_status", {"domains": ["switch"]}, "success"),
            ("field", "ha_get_status", {}, "unauthorized"),
            ("main", "ha_get_status", {"entityIds": ["../../secrets"]}, "invalid_request"),
            ("main", "ha_call_service", {"domain": "shell_command", "service": "x", "data": {"token": "s3cr3t-value"}}, "not_allowed"),
            ("main", "ha_set_entity", {"entityId": "switch.no_such_pump", "value": "on"}, "not_found"),
            ("main", "ha_set_entity", {"entityId": "switch.field_1_valve", "value": "on"}, "success"),
        ]  # fmt: skip
        for folder, action, params, expected in cases:
            result = await host.ask(folder, action, params)
            assert (result["errorCode"] or result["status"]) == expected, result
        audit = host.audit()
    assert [(r["group"], r["action"], r["errorCode"] or r["status"]) for r in audit] == [
        (folder, action, expected) for folder, action, _, expected in cases
    ]
    for record, (_, _, params, _) in zip(audit, cases, strict=True):
        assert set(record) == KEYS and record["durationMs"] >= 0
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"])
        if "data" not in params:
            assert record["params"] == params
    assert audit[3]["params"]["data"] == {"token": REDACTED}
    # neither the agent's secret nor farmhost's HA token is in any file of the data dir
    for path in (p for p in data_dir.rglob("*") if p.is_file()):
        content = path.read_bytes()
        assert ha_reset.farmhost_token.encode() not in content, path
        assert b"s3cr3t-value" not in content, path
