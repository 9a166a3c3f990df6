"""The Docker backend for real: agent runs in containers of the agent image, on the tests' engine.

`make test` starts a private engine (scripts/docker-engine) and builds `farmhost-agent:test` from container/
on a Debian base made here (scripts/docker-images); these tests run the probe and the real runner in it through
the same AgentRuntime as bwrap. Without an engine they skip, saying so; with an engine but no image they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from docker_engine import AGENT_IMAGE, ENGINE_HOST, docker, requires_engine
from docker_engine import image as engine_image
from farmhost_testing import Daemon, init_data_dir_in_process, scaled
from llm_stub import Reply, ScriptedLLM
from runtime_support import PROBE, SECRETS, make_runtime, probe_job, report, settings_for

from farmhost.agents.jobs import AgentJob
from farmhost.agents.sandbox.backends import DockerBackend
from farmhost.config import Settings

IN_IMAGE = ("python", "-c", PROBE)  # the image's interpreter (its venv's python), not the host's

pytestmark = requires_engine


@pytest.fixture(scope="module")
def image() -> str:
    return engine_image(AGENT_IMAGE)


@pytest.fixture(autouse=True)
def engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's environment names the engine, as a deployment's would (the backend's CLI reads it there)."""
    if ENGINE_HOST:
        monkeypatch.setenv("DOCKER_HOST", ENGINE_HOST)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = init_data_dir_in_process(tmp_path / "data")
    (root / ".env").write_text(f"HA_TOKEN={SECRETS['HA_TOKEN']}\n")
    (root / "groups" / "global").mkdir(exist_ok=True)
    (root / "groups" / "global" / "MEMORY.md").write_text("global memory for everyone\n")
    return root


def docker_settings(root: Path, image: str, **values: Any) -> Settings:
    return settings_for(root, FARMHOST_AGENT_RUNTIME="docker", FARMHOST_AGENT_IMAGE=image, **values)


async def run_probe(settings: Settings, folder: str, **todo: Any) -> dict[str, Any]:
    runtime = make_runtime(settings, command=IN_IMAGE)
    await runtime.start()
    try:
        assert isinstance(runtime.backend, DockerBackend)
        return report(await runtime.submit(probe_job(folder, **todo)))
    finally:
        await runtime.stop()


async def test_a_run_in_the_container_has_only_its_mounts_no_network_no_root_no_capabilities(
    root: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)  # in the daemon's environment, as systemd would put them
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    writes = ["/workspace/group/x", "/workspace/global/x", "/workspace/farm-state/x", "/workspace/run/x",
              "/workspace/ipc/actions/.probe", "/etc/x", "/usr/x", "/tmp/x", "/dev/shm/x"]  # fmt: skip
    try:
        seen = await run_probe(
            docker_settings(root, image), "field", write=writes, list=["/sys/class/net", "/workspace"],
            read=[str(root / ".env"), "/workspace/global/MEMORY.md"], tcp=["127.0.0.1", port], proc_scan=True,
        )  # fmt: skip
    finally:
        server.close()
    assert seen["write"] == {
        "/workspace/group/x": "ok", "/workspace/global/x": "error:EROFS", "/workspace/farm-state/x": "error:EROFS",
        "/workspace/run/x": "error:EROFS", "/workspace/ipc/actions/.probe": "ok", "/etc/x": "error:EROFS",
        "/usr/x": "error:EROFS", "/tmp/x": "ok", "/dev/shm/x": "ok",
    }  # fmt: skip
    assert seen["list"]["/sys/class/net"] == ["lo"], "--network none: a loopback and nothing else"
    assert seen["tcp"].startswith("error:"), seen["tcp"]
    assert seen["read"][str(root / ".env")] == "error:ENOENT", "the host's data dir is not in the container"
    assert seen["read"]["/workspace/global/MEMORY.md"] == "ok:global memory for everyone\n"
    assert seen["uid"] != 0 and seen["caps"] == ["0000000000000000"], (seen["uid"], seen["caps"])
    assert not any(secret in seen["proc_text"] or secret in json.dumps(seen["env"]) for secret in SECRETS.values())
    assert seen["cwd"] == "/workspace/group"
    written = root / "groups" / "field" / "x"
    assert written.read_text() == "written by the probe" and written.stat().st_uid == seen["uid"]


async def test_the_engine_holds_memory_processes_cpu_and_tmp_limits(root: Path, image: str) -> None:
    (root / "agent-limits.json").write_text(
        json.dumps({"groups": {"field": {"memoryMb": 128, "pids": 32, "cpuPercent": 50, "tmpMb": 16}}})
    )
    seen = await run_probe(
        docker_settings(root, image), "field", forks=64, fill={"/tmp/big": 40, "/dev/shm/big": 40},
        mem_children=[1, 200], cpu_children=[2, 2],
    )  # fmt: skip
    made, failed = seen["forks"]
    assert made < 32 and failed == "error:EAGAIN", seen["forks"]
    assert seen["fill"]["/tmp/big"][0] == "error:ENOSPC" and seen["fill"]["/tmp/big"][1] <= 16 << 20
    assert seen["fill"]["/dev/shm/big"][0] == "error:ENOSPC" and seen["fill"]["/dev/shm/big"][1] <= 16 << 20
    (status,) = seen["mem_children"]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, f"a child over 128 MB is OOM-killed: {status}"
    cpu, wall = seen["cpu_children"]
    assert cpu <= 0.5 * wall * 1.3 + 0.2, f"two spinning children got {cpu:.2f} s of CPU in {wall:.2f} s at 50 %"


async def test_requests_and_the_llm_proxy_cross_the_container_boundary(data_dir: Path, image: str) -> None:
    daemon = Daemon(data_dir).start()  # answers the probe's ping from its IPC directory
    try:
        with ScriptedLLM([Reply("Irrigation is on schedule.")]) as llm:
            settings = docker_settings(
                data_dir, image, FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_MODEL="farm-model",
                FARMHOST_LLM_API_KEY=SECRETS["FARMHOST_LLM_API_KEY"],
            )  # fmt: skip
            seen = await run_probe(settings, "field", ipc_ping="docker-ping-1", openai="is the irrigation on?")
    finally:
        assert daemon.stop() == 0, daemon.log()[-2000:]
    result = seen["ipc_result"]
    assert result["requestId"] == "docker-ping-1" and result["status"] == "success", result
    assert seen["openai"] == {"content": "Irrigation is on schedule.", "model": "farm-model"}
    (request,) = llm.requests
    assert request.headers["authorization"] == f"Bearer {SECRETS['FARMHOST_LLM_API_KEY']}"
    assert SECRETS["FARMHOST_LLM_API_KEY"] not in json.dumps(seen)


async def test_the_images_runner_answers_through_the_proxy(root: Path, image: str) -> None:
    """The image's own entry (`python -m farmagent.run`): the AgentInput in, one LLM turn, the answer out."""
    with ScriptedLLM([Reply("The field pumps ran for 20 minutes.")]) as llm:
        settings = docker_settings(
            root, image, FARMHOST_LLM_BASE_URL=llm.base_url, FARMHOST_LLM_MODEL="farm-model",
            FARMHOST_LLM_API_KEY=SECRETS["FARMHOST_LLM_API_KEY"],
        )  # fmt: skip
        runtime = make_runtime(settings, command=None)
        await runtime.start()
        try:
            outcome = await asyncio.wait_for(
                runtime.submit(AgentJob(folder="field", prompt="how long did the pumps run?", scheduled=True)),
                timeout=scaled(120),
            )
        finally:
            await runtime.stop()
    assert outcome.status == "ok", outcome.log_path.read_text()
    assert outcome.answer == "The field pumps ran for 20 minutes." and outcome.exit_code == 0
    (request,) = llm.requests
    assert "how long did the pumps run?" in request.text() and request.model == "farm-model"
    log = outcome.log_path.read_text()
    assert "docker run" in log or "run --rm" in log, log[:2000]


async def test_a_container_run_is_never_host_root_and_its_setuid_bits_do_not_survive(root: Path, image: str) -> None:
    seen = await run_probe(docker_settings(root, image), "field", setid_file="/workspace/group/sh-root")
    made = (root / "groups" / "field" / "sh-root").lstat()
    assert seen["uid"] != 0 and made.st_uid == seen["uid"], (seen["uid"], made.st_uid)
    assert seen["setid_mode"] == "0o6755", "inside the run the agent may set the bits"
    assert stat.S_IMODE(made.st_mode) & (stat.S_ISUID | stat.S_ISGID) == 0, oct(made.st_mode)


# Long enough for a loaded machine to start the container and the probe to set up its SIGTERM handling.
DOCKER_TIMEOUT = 8.0


@pytest.mark.parametrize(
    ("todo", "exit_code"), [({"ignore_term": True}, None), ({"note_term": True}, 7)], ids=["ignores", "exits"]
)
async def test_a_run_over_its_time_is_stopped_and_its_container_removed(
    root: Path, image: str, todo: dict[str, Any], exit_code: int | None
) -> None:
    """SIGTERM reaches the agent through `docker run` and the container's init; ignored, the container is removed."""
    (root / "agent-limits.json").write_text(json.dumps({"groups": {"field": {"timeoutSeconds": DOCKER_TIMEOUT}}}))
    runtime = make_runtime(docker_settings(root, image), command=IN_IMAGE, term_grace=1.0)
    await runtime.start()
    try:
        outcome = await runtime.submit(probe_job("field", sleep=60, **todo))
    finally:
        await runtime.stop()
    assert outcome.status == "timeout"
    assert outcome.error == f"the run took longer than {DOCKER_TIMEOUT:g} s and was stopped"
    log = outcome.log_path.read_text()
    if exit_code is not None:
        assert outcome.exit_code == exit_code and "probe got SIGTERM" in log, (outcome.exit_code, log[-2000:])
    assert outcome.duration_seconds < DOCKER_TIMEOUT + scaled(10), outcome.duration_seconds
    left = docker("ps", "-aq", "--filter", f"label=farmhost.data={root}")
    assert left.returncode == 0 and left.stdout == "", f"containers left: {left.stdout}{left.stderr}"


def test_the_image_carries_the_runners_bytecode(image: str) -> None:
    """A run's root is read-only: every module the runner imports must come compiled, or each run compiles it."""
    check = (
        "import importlib.util, os, sys; import farmagent.run; "
        "mods = [m for m in sys.modules.values() if getattr(m, '__file__', '') and m.__file__.endswith('.py')]; "
        "print(len(mods)); print([m.__name__ for m in mods if not os.path.exists(importlib.util.cache_from_source(m.__file__))])"
    )
    done = docker(
        "run", "--rm", "--read-only", "--network", "none", "--user", "1000:1000", "--entrypoint", "python",
        image, "-c", check,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    count, missing = done.stdout.splitlines()
    assert int(count) > 50 and missing == "[]", done.stdout
