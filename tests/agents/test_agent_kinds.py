"""Agent kinds: the built-in runner, or the operator's own program (`command`) in the same sandbox, per group."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import PROBE, make_runtime, probe_job, report, settings_for

from farmhost.agents.kinds import IMAGE_OPENCODE_BIN
from farmhost.agents.runtime import NO_LLM
from farmhost.agents.sandbox.backends.docker import DockerBackend
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


# An engine CLI that answers `ps` with no container and `run` with an AgentResult whose answer is its own argv.
ENGINE = """#!{python}
import json, sys
if sys.argv[1] == "run":
    sys.stdin.read()
    print(json.dumps({{"status": "ok", "answer": json.dumps(sys.argv), "error": None, "turns": 0, "toolCalls": 0}}))
"""


async def test_in_the_agent_image_kind_opencode_runs_the_images_own_binary(root: Path, tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.write_text(ENGINE.format(python=sys.executable))
    engine.chmod(0o755)
    backend = DockerBackend(image="farmhost-agent:test", user=(1000, 1000), data_root=str(root), engine=str(engine))
    # No OpenCode on this host at all: the image has its own, so the run needs none.
    settings = settings_for(root, FARMHOST_AGENT_KIND="opencode", FARMHOST_OPENCODE_BIN=str(tmp_path / "missing"),
                            FARMHOST_LLM_BASE_URL="http://127.0.0.1:9/v1", FARMHOST_LLM_MODEL="farm-model")  # fmt: skip
    runtime = make_runtime(settings, backend=backend, command=None)
    await runtime.start()
    try:
        argv = report(await runtime.submit(probe_job("field")))
    finally:
        await runtime.stop()
    command = [argv[argv.index("--entrypoint") + 1], *argv[argv.index("farmhost-agent:test") + 1 :]]
    assert command == ["python", "-I", "-m", "farmagent.opencode_run"], (
        "the image's entrypoint replaced by the run's command"
    )
    assert f"FARMAGENT_OPENCODE={IMAGE_OPENCODE_BIN}" in argv
    assert not any(str(tmp_path / "missing") in arg for arg in argv)
    volumes = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-v"]
    assert volumes and not any("opencode" in volume for volume in volumes), volumes
    # On the host (bwrap) the same settings find no OpenCode, and the run is refused with what to install.
    runtime = make_runtime(settings.model_copy(update={"agent_runtime": "bwrap"}), command=None)
    await runtime.start()
    try:
        refused = await runtime.submit(probe_job("field"))
    finally:
        await runtime.stop()
    assert refused.status == "error" and refused.error is not None
    assert "no OpenCode binary" in refused.error and "deploy/install.sh --with-opencode" in refused.error
