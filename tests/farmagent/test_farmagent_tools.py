"""The shared tool table: the host's contract, accepted by the real host, arguments checked before writing."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_support import Farm, offline_context, pending
from farmagent import tool_schemas, wire
from farmagent.tools import TOOLS, TOOLS_BY_NAME, call_tool, tools_for
from farmhost_testing import MAIN_JID

CONTAINER = Path(__file__).parents[2] / "container"


def test_farmagent_never_imports_farmhost() -> None:
    for path in (CONTAINER / "farmagent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "farmhost" or n.startswith("farmhost.") for n in names), f"{path}: {names}"


def test_every_request_of_the_contract_has_a_tool() -> None:
    operations = set(wire.QUEUE_OF_TYPE) - {"message", "file", "farm_action", "memory_action"}
    operations |= {"send_message", "send_file", *tool_schemas.contract()["actions"]}
    assert operations <= set(TOOLS_BY_NAME)
    assert {"list_tasks", "list_groups"} <= set(TOOLS_BY_NAME)
    assert len(TOOLS_BY_NAME) == len(TOOLS)
    for tool in TOOLS:
        assert re.fullmatch(r"[a-z][a-z_]{1,63}", tool.name)
        assert len(tool.description) > 40, tool.name
        assert tool.parameters["type"] == "object" and tool.parameters["additionalProperties"] is False
        assert set(tool.parameters["required"]) <= set(tool.parameters["properties"])


def test_groups_other_than_main_are_not_offered_main_only_tools() -> None:
    hidden = {t.name for t in TOOLS} - {t.name for t in tools_for(is_main=False)}
    assert hidden == {"list_groups", "refresh_groups", "register_group"}
    assert tools_for(is_main=True) == TOOLS


# Every tool with arguments the host accepts; the expected answer without Home Assistant configured.
CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("send_message", {"chatJid": MAIN_JID, "text": "Tool table check"}, "ok"),
    ("send_file", {"chatJid": MAIN_JID, "path": "report.txt", "caption": "the report"}, "ok"),
    ("schedule_task", {"prompt": "Morning check", "schedule_type": "cron", "schedule_value": "0 6 * * *"}, "ok"),
    ("pause_task", {"taskId": "task-none"}, "not_found"),
    ("resume_task", {"taskId": "task-none"}, "not_found"),
    ("cancel_task", {"taskId": "task-none"}, "not_found"),
    ("list_tasks", {}, "ok"),
    ("list_groups", {}, "ok"),
    ("refresh_groups", {}, "ok"),
    ("register_group", {"jid": "telegram:300", "name": "Greenhouse", "folder": "greenhouse", "trigger": "@farm"}, "ok"),
    ("ping", {}, "ok"),
    ("memory_search", {"query": "tomatoes", "topK": 2, "sources": "all"}, "ok"),
    ("memory_get", {"path": "MEMORY.md", "from": 2, "lines": 1}, "ok"),
    ("memory_write", {"path": "memory/checks.md", "text": "- tool table check", "mode": "append"}, "ok"),
    ("farm_state_read", {"file": "current"}, "not_found"),
    ("ha_get_status", {"domains": ["sensor"], "entityIds": ["switch.pump"]}, "upstream_unavailable"),
    (
        "ha_call_service",
        {"domain": "switch", "service": "turn_on", "target": {"entity_id": "switch.pump"}},
        "upstream_unavailable",
    ),
    ("ha_set_entity", {"entityId": "input_number.irrigation_minutes", "value": 25}, "upstream_unavailable"),
    ("ha_restart", {}, "upstream_unavailable"),
    ("ha_dashboard_get", {"dashboard": "farm"}, "ok"),
    ("ha_dashboard_validate", {"content": "views:\n  - path: a\n    cards: []\n"}, "ok"),
    ("ha_dashboard_patch", {"operations": [{"op": "set_theme", "theme": "dark"}], "dryRun": True}, "ok"),
    ("ha_apply_dashboard", {"backup": True}, "upstream_unavailable"),
    ("ha_capture_screenshot", {"view": "overview", "width": 800, "height": 600}, "upstream_unavailable"),
    ("farm_state_refresh", {}, "upstream_unavailable"),
    ("ha_assist", {"text": "turn on the irrigation pump", "language": None}, "upstream_unavailable"),
    ("ha_history", {"entityIds": ["switch.irrigation_pump"], "start": None}, "upstream_unavailable"),
]


def test_the_call_table_covers_every_tool() -> None:
    assert {name for name, _, _ in CALLS} == set(TOOLS_BY_NAME)


@pytest.mark.parametrize(("name", "arguments", "expected"), CALLS, ids=[c[0] for c in CALLS])
def test_every_tool_reaches_the_real_host(farm: Farm, name: str, arguments: dict[str, Any], expected: str) -> None:
    (farm.workspace() / "report.txt").write_text("all fields watered\n")
    outcome = call_tool(farm.context(), name, arguments)
    document = json.loads(outcome.text)
    if expected == "ok":
        assert not outcome.is_error, document
    else:
        assert outcome.is_error and document["errorCode"] == expected, document
        assert document["error"]
    assert farm.quarantine() == []  # the host decoded every request: nothing was malformed


@pytest.mark.parametrize(
    ("name", "arguments", "problem"),
    [
        ("memory_search", {}, "arguments.query is required"),
        ("memory_search", {"query": "x", "topK": "5"}, "arguments.topK must be integer"),
        ("memory_search", {"query": "x", "topK": 65}, "at most 64"),
        ("memory_search", {"query": "x", "top_k": 5}, "unknown key 'top_k'"),
        ("memory_get", {"path": "MEMORY.md", "lines": True}, "arguments.lines must be integer"),
        ("schedule_task", {"prompt": "p", "schedule_type": "weekly", "schedule_value": "x"}, "one of 'cron'"),
        ("ha_set_entity", {"entityId": "switch.a", "value": None}, "arguments.value is required"),
        ("ha_dashboard_patch", {"operations": []}, "item count must be at least 1"),
        ("ha_dashboard_patch", {"operations": ["add_view"]}, "operations[0] must be object"),
        ("ha_capture_screenshot", {"zoom": 9}, "at most 3"),
        ("send_message", {"chatJid": "telegram:1", "text": ""}, "length must be at least 1"),
        ("no_such_tool", {}, "there is no tool 'no_such_tool'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, name: str, arguments: dict[str, Any], problem: str
) -> None:
    context = offline_context(tmp_path)
    outcome = call_tool(context, name, arguments)
    document = json.loads(outcome.text)
    assert outcome.is_error and document["errorCode"] == "invalid_request"
    assert problem in document["error"], document["error"]
    assert pending(context.client.ipc_dir) == []


def test_a_dead_host_is_a_tool_error_not_a_crash(tmp_path: Path) -> None:
    outcome = call_tool(offline_context(tmp_path, status="stopped"), "ping", {})
    assert outcome.is_error and json.loads(outcome.text)["errorCode"] == "host_unavailable"


def test_the_shell_cli_calls_the_same_tools(farm: Farm) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "farmagent.cli", *args]
        return subprocess.run(command, env=farm.agent_env(), capture_output=True, text=True, timeout=30, check=False)

    found = cli("call", "memory_search", '{"query": "tomatoes", "topK": 1}')
    assert found.returncode == 0 and "San Marzano" in json.loads(found.stdout)["hits"][0]["snippet"]
    refused = cli("call", "memory_get", '{"path": "../etc/passwd"}')
    assert refused.returncode == 1 and json.loads(refused.stdout)["errorCode"] in ("invalid_request", "not_allowed")
    listed = cli("tools")
    assert [t["name"] for t in json.loads(listed.stdout)] == [t.name for t in TOOLS]
    assert cli("call", "ping", "not json").returncode == 2
