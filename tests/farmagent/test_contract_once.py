"""One contract, written once: the host's models are the source, the agent's tools and wire sets are theirs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_support import Farm
from farmagent import argcheck, tool_schemas, wire
from farmagent.errors import InvalidRequestError
from farmagent.tools import TOOLS_BY_NAME, call_tool
from farmhost_testing import MAIN_JID, farmhost

from farmhost.protocol import codes
from farmhost.protocol.catalog import ACTION_PARAMS, ACTION_ROWS, FARM_ACTIONS, MEMORY_ACTIONS, REQUESTS
from farmhost.protocol.params import MAX_QUERY_CHARS, WIDTH_RANGE
from farmhost.protocol.requests import QUEUE_TYPES
from farmhost.protocol.schema import contract_schema, tool_table

ROOT = Path(__file__).parents[2]
SHIPPED = ROOT / "container" / "farmagent" / tool_schemas.CONTRACT_FILE
SHIPPED_TABLE = ROOT / "container" / "farmagent" / tool_schemas.TABLE_FILE
DOCS = ROOT / "docs" / "schema" / "ipc-v1.schema.json"


def test_the_host_uses_the_wire_modules_own_definitions() -> None:
    # The same objects, not copies that a test compares: a change on one side is a change on both.
    for name in ("ErrorCode", "Queue", "Status", "REQUEST_ID_RE", "FOLDER_RE", "DASHBOARD_RE", "QUEUE_OF_TYPE"):
        assert getattr(codes, name) is getattr(wire, name), name
    assert {kind for kinds in QUEUE_TYPES.values() for kind in kinds} == set(wire.QUEUE_OF_TYPE)
    # The actions are the host's rows; the sandbox knows them from the export alone.
    assert list(tool_schemas.farm_actions()) == list(FARM_ACTIONS)
    assert set(tool_schemas.contract()["actions"]) == {*FARM_ACTIONS, *MEMORY_ACTIONS} == set(ACTION_PARAMS)


def test_the_agent_package_ships_the_current_export(tmp_path: Path) -> None:
    printed = farmhost("schema", data_dir=tmp_path / "data")
    assert printed.returncode == 0, printed.stderr
    assert SHIPPED.read_text(encoding="utf-8") == printed.stdout, "stale: run `make schema`"
    assert DOCS.read_text(encoding="utf-8") == printed.stdout, "stale: run `make schema`"
    assert tool_schemas.contract() == contract_schema()
    table = farmhost("schema", "--tools", data_dir=tmp_path / "data")
    assert table.returncode == 0, table.stderr
    assert SHIPPED_TABLE.read_text(encoding="utf-8") == table.stdout, "stale: run `make schema`"
    assert tool_schemas.tool_table() == tuple(tool_table()["tools"])


def test_every_tool_that_reaches_the_host_is_its_row_on_the_host() -> None:
    # Name, text, hints and result are written once, in farmhost/protocol/catalog.py; the sandbox only reads them.
    rows = [(row.tool, row.tool.name or row.type) for row in REQUESTS]
    rows += [(row.tool, row.name) for row in ACTION_ROWS.values()]
    assert {name for _, name in rows} == {entry["name"] for entry in tool_schemas.tool_table()}
    for tool, name in rows:
        spec = TOOLS_BY_NAME[name]
        assert (spec.description, spec.result, spec.main_only) == (tool.description, tool.result, tool.main_only)
        assert vars(spec.hints) == vars(tool.hints), name
        assert spec.farm_action == (name in FARM_ACTIONS), name
    for row in REQUESTS:  # a request tool offers the request's fields under their contract names
        assert list(TOOLS_BY_NAME[row.tool.name or row.type].parameters["properties"]) == list(row.fields), row.type


def test_the_client_waits_longer_than_the_host_for_every_farm_action() -> None:
    for name, wait in tool_schemas.farm_actions().items():
        row = ACTION_ROWS[name]
        assert (wait or wire.DEFAULT_TIMEOUT) >= row.timeout + 2 + 5, name  # the router's margin, then time to answer
        assert (wait is None) == (row.timeout + 10 <= wire.DEFAULT_TIMEOUT), name
    assert tool_schemas.farm_actions()["ha_restart"] == 170.0
    assert tool_schemas.farm_actions()["ha_capture_screenshot"] == 45.0


def test_every_action_tool_offers_exactly_the_hosts_params() -> None:
    exported = contract_schema()
    for action, model in ACTION_PARAMS.items():
        tool = TOOLS_BY_NAME[action]
        assert tool.parameters == tool_schemas.action_parameters(action)
        fields = {field.alias or name for name, field in model.model_fields.items()}
        assert set(tool.parameters["properties"]) == fields, action
        assert exported["actions"][action] == {"$ref": f"#/$defs/{model.__name__}"}
        for name, schema in tool.parameters["properties"].items():
            assert schema.get("description"), f"{action}.{name} has no description"
    # A bound exists once: the host's constant is what the model is told and what the sandbox checks.
    width = TOOLS_BY_NAME["ha_capture_screenshot"].parameters["properties"]["width"]
    assert (width["minimum"], width["maximum"]) == WIDTH_RANGE
    assert TOOLS_BY_NAME["memory_search"].parameters["properties"]["query"]["maxLength"] == MAX_QUERY_CHARS


def test_every_request_tool_describes_every_parameter() -> None:
    for tool in TOOLS_BY_NAME.values():
        for name, schema in tool.parameters["properties"].items():
            assert schema.get("description"), f"{tool.name}.{name} has no description"
            assert "anyOf" not in schema or all(b != {"type": "null"} for b in schema["anyOf"]), (tool.name, name)


def test_the_exported_schema_checks_params_per_action() -> None:
    schema = contract_schema()
    farm = schema["$defs"]["FarmActionRequest"]
    branches = {b["if"]["properties"]["action"]["const"]: b["then"] for b in farm["allOf"]}
    assert set(branches) == set(FARM_ACTIONS)
    shot = branches["ha_capture_screenshot"]["properties"]["params"]["$ref"]
    assert schema["$defs"][shot.rsplit("/", 1)[1]]["properties"]["width"]["maximum"] == WIDTH_RANGE[1]


@pytest.mark.parametrize(
    ("name", "arguments", "phrase"),
    [
        ("ha_capture_screenshot", {"width": WIDTH_RANGE[1] + 1}, "at most 3840"),
        ("ha_capture_screenshot", {"selector": "a;b"}, "must match"),
        ("ha_capture_screenshot", {"dashboard": "../etc"}, "must match"),
        ("memory_search", {"query": "x" * (MAX_QUERY_CHARS + 1)}, f"at most {MAX_QUERY_CHARS}"),
        ("ha_get_status", {"entityIds": ["Sensor.X"]}, "must match"),
        ("schedule_task", {"prompt": "p", "schedule_type": "cron", "schedule_value": True}, "must be"),
        ("ha_call_service", {"domain": "switch", "service": "turn_on", "target": {"entity_id": 3}}, "must be"),
    ],
)
def test_what_the_host_refuses_is_refused_in_the_sandbox_first(
    farm: Farm, name: str, arguments: dict[str, Any], phrase: str
) -> None:
    outcome = call_tool(farm.context(), name, arguments)
    assert outcome.is_error and outcome.value["errorCode"] == "invalid_request", outcome.text
    assert phrase in outcome.value["error"], outcome.value["error"]
    queues = farm.data_dir / "ipc" / "main"
    assert not [p for q in wire.QUEUE_DIRS for p in (queues / q).iterdir()]  # nothing was written


def test_what_the_sandbox_passes_the_host_accepts(farm: Farm) -> None:
    # null means the default on both sides; a value at the bound is accepted on both sides.
    outcome = call_tool(
        farm.context(), "memory_search", {"query": "x" * MAX_QUERY_CHARS, "topK": 64, "groupFolder": None}
    )
    assert not outcome.is_error, outcome.text
    sent = call_tool(farm.context(), "send_message", {"chatJid": MAIN_JID, "text": "bound check"})
    assert not sent.is_error, sent.text


def test_argcheck_understands_every_keyword_the_tools_use() -> None:
    known = {
        "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "pattern", "minimum",
        "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "items", "minItems", "maxItems",
        "description", "default",
    }  # fmt: skip

    def keywords(node: Any) -> set[str]:
        if isinstance(node, list):
            return set().union(*(keywords(item) for item in node)) if node else set()
        if not isinstance(node, dict):
            return set()
        found = set(node)
        for key, value in node.items():
            if key == "properties":
                found |= set().union(*(keywords(v) for v in value.values())) if value else set()
            elif key in ("items", "additionalProperties", "anyOf"):
                found |= keywords(value)
        return found

    for tool in TOOLS_BY_NAME.values():
        assert keywords(tool.parameters) <= known, (tool.name, keywords(tool.parameters) - known)
    with pytest.raises(InvalidRequestError, match="must match"):
        argcheck.check({"type": "string", "pattern": "^a+$"}, "b")
    argcheck.check({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 3)
    assert json.dumps(tool_schemas.action_parameters("ha_restart")) == json.dumps(
        {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    )
