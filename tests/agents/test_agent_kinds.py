"""Agent kinds: the built-in runner, or the operator's own program (`command`) in the same sandbox, per group."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import PROBE, make_runtime, probe_job, report, settings_for

from farmhost.agents.runtime import NO_LLM
from farmhost.config import load_settings
from farmhost.errors import ConfigError

PROBE_ARGV = [sys.executable, "-c", PROBE]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def test_a_command_agent_runs_in_the_sandbox_with_the_contract_of_every_agent(root: Path) -> None:
    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_KIND="command",
                            FARMHOST_AGENT_COMMAND=shlex.join(PROBE_ARGV))  # fmt: skip
    runtime = make_runtime(settings, command=None)
    await runtime.start()
    try:
        seen = report(await runtime.submit(probe_job("field", read=["/etc/shadow"])))
    finally:
        await runtime.stop()
    # It got the AgentInput on stdin, the sandbox's environment and nothing of the host; no LLM was needed.
    assert seen["input"]["groupFolder"] == "field" and seen["input"]["isMain"] is False
    assert seen["cwd"] == "/workspace/group" and seen["env"]["FARMAGENT_IPC_DIR"] == "/workspace/ipc"
    assert seen["read"]["/etc/shadow"].startswith("error:")


async def test_the_kind_is_chosen_per_group_in_the_limits_file(root: Path) -> None:
    limits = {"groups": {"field": {"agentKind": "command", "agentCommand": PROBE_ARGV}}}
    (root / "agent-limits.json").write_text(json.dumps(limits))
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap"), command=None)
    await runtime.start()
    try:
        field = await runtime.submit(probe_job("field"))
        main = await runtime.submit(probe_job("main"))
    finally:
        await runtime.stop()
    assert report(field)["input"]["groupFolder"] == "field"
    assert (main.status, main.error) == ("error", NO_LLM), "main keeps the built-in runner, which needs an LLM"


def test_a_command_kind_without_its_command_is_refused_with_what_to_set(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARMHOST_AGENT_KIND", "command")
    with pytest.raises(ConfigError, match="FARMHOST_AGENT_KIND=command needs FARMHOST_AGENT_COMMAND"):
        load_settings(data_dir=root, env_file=None)
    monkeypatch.setenv("FARMHOST_AGENT_COMMAND", "'unbalanced")
    with pytest.raises(ConfigError, match="FARMHOST_AGENT_COMMAND: not valid shell words"):
        load_settings(data_dir=root, env_file=None)
