"""Isolation, tested from inside real bwrap runs: what a probe agent can and cannot reach of the host."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, init_data_dir_in_process
from llm_stub import Reply, ScriptedLLM
from runtime_support import SECRETS, Sandbox, make_runtime, probe_job, report, settings_for

from farmhost.agents.jobs import AgentJob
from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.backends import BwrapBackend
from farmhost.config import Settings
from farmhost.layout import REPO_ROOT


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = init_data_dir_in_process(tmp_path / "data")
    (root / ".env").write_text(f"HA_TOKEN={SECRETS['HA_TOKEN']}\n")
    (root / "farm-profile.json").write_text('{"policy": {}}')
    (root / "groups" / "main" / "MEMORY.md").write_text("main's private memory\n")
    (root / "ipc" / "main" / "current_tasks.json").write_text("[]")
    (root / "groups" / "global").mkdir(exist_ok=True)
    (root / "groups" / "global" / "MEMORY.md").write_text("global memory for everyone\n")
    (root / "farm-state" / "current.json").write_text('{"pump": "on"}')
    return root


async def run_probe(settings: Settings, folder: str, **todo: Any) -> tuple[dict[str, Any], AgentRuntime]:
    runtime = make_runtime(settings)
    await runtime.start()
    try:
        assert isinstance(runtime.backend, BwrapBackend)
        return report(await runtime.submit(probe_job(folder, **todo))), runtime
    finally:
        await runtime.stop()


async def test_the_agent_cannot_reach_the_host(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)  # in the daemon's own environment too, as systemd would put them
    connections: list[object] = []
    server = await asyncio.start_server(lambda r, w: connections.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    host_tmp = f"/tmp/farmhost-probe-{secrets.token_hex(4)}"
    reads = [
        str(root / "farmhost.db"),
        str(root / ".env"),
        str(root / "farm-profile.json"),
        str(root / "groups" / "main" / "MEMORY.md"),
        str(root / "ipc" / "main" / "current_tasks.json"),
        str(REPO_ROOT / "pyproject.toml"),
        str(REPO_ROOT / ".env"),
        str(REPO_ROOT / "farmhost" / "config.py"),
        "/etc/shadow",
        "/etc/passwd",
        "/root/.bashrc",
    ]
    writes = [
        "/workspace/global/x",
        "/workspace/farm-state/x",
        "/workspace/run/x",
        "/workspace/x",
        "/x",
        "/usr/x",
        f"{os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}/x",
        str(root / "groups" / "field" / "x"),
        host_tmp,
    ]
    try:
        settings = settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", **SECRETS)
        seen, runtime = await run_probe(
            settings, "field", read=reads, write=writes, list=["/", "/workspace", "/etc", "/root", str(root)],
            tcp=["127.0.0.1", port], proc_scan=True,
        )  # fmt: skip
    finally:
        server.close()
        await server.wait_closed()
    assert all(result.startswith("error:") for result in seen["read"].values()), seen["read"]
    assert seen["write"][host_tmp] == "ok" and not os.path.exists(host_tmp)  # its /tmp is its own
    del seen["write"][host_tmp]
    assert all(result.startswith("error:") for result in seen["write"].values()), seen["write"]
    assert not (root / "groups" / "field" / "x").exists()
    assert seen["tcp"].startswith("error:") and connections == []
    assert seen["list"]["/etc"] == seen["list"][str(root)] == "error:ENOENT"
    assert seen["list"]["/workspace"] == ["farm-state", "global", "group", "ipc", "run"]  # no dashboards: not main
    backend = runtime.backend
    assert isinstance(backend, BwrapBackend)
    tops = {Path(p).parts[1] for p in backend.python.ro_paths} | {Path(e.path).parts[1] for e in backend.system}
    assert set(seen["list"]["/"]) == tops | {"dev", "proc", "tmp", "workspace"}
    under_root = {p.relative_to("/root").parts[0] for p in backend.python.ro_paths if p.is_relative_to("/root")}
    assert set(seen["list"]["/root"]) == under_root
    assert seen["caps"] == ["0000000000000000"]
    everything = json.dumps(seen)
    for value in SECRETS.values():
        assert value not in everything  # not in its env, args, files or any /proc/*/environ it can read
    assert set(seen["env"]) == {
        "FARMAGENT_IPC_DIR", "FARMAGENT_GROUP_DIR", "FARMAGENT_GLOBAL_DIR", "FARMAGENT_FARM_STATE_DIR",
        "FARMAGENT_LLM_SOCKET", "TZ", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD",
    }  # fmt: skip


async def test_the_agent_uses_its_own_directories(root: Path, sandbox: Sandbox) -> None:
    """The same in bwrap and in a container of the agent image: main's workspace, with the dashboards."""
    job = probe_job(
        "main",
        read=["/workspace/global/MEMORY.md", "/workspace/farm-state/current.json", "/workspace/group/MEMORY.md"],
        write=["/workspace/group/notes.md", "/workspace/ipc/actions/.draft.tmp", "/workspace/dashboard/farm.yaml"],
        list=["/workspace"],
    )
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        seen = report(await runtime.submit(job))
    finally:
        await runtime.stop()
    assert seen["read"] == {
        "/workspace/global/MEMORY.md": "ok:global memory for everyone\n",
        "/workspace/farm-state/current.json": 'ok:{"pump": "on"}',
        "/workspace/group/MEMORY.md": "ok:main's private memory\n",
    }
    assert set(seen["write"].values()) == {"ok"}
    assert (root / "groups" / "main" / "notes.md").read_text() == "written by the probe"
    assert (root / "ipc" / "main" / "actions" / ".draft.tmp").exists()
    assert (root / "dashboards" / "farm.yaml").exists()
    assert seen["list"]["/workspace"] == ["dashboard", "farm-state", "global", "group", "ipc", "run"]
    assert seen["cwd"] == "/workspace/group" and seen["env"]["HOME"] == "/workspace/group"


async def test_the_agent_sends_a_request_and_reads_its_result(data_dir: Path, daemon: Daemon) -> None:
    settings = settings_for(data_dir, FARMHOST_AGENT_RUNTIME="bwrap")
    seen, _ = await run_probe(settings, "field", ipc_ping="probe-ping-1")
    result = seen["ipc_result"]
    assert result["requestId"] == "probe-ping-1" and result["status"] == "success", result
    assert result["result"]["pong"] is True


async def test_the_agent_reaches_the_llm_only_through_the_proxy(root: Path) -> None:
    with ScriptedLLM([Reply("Irrigation is on schedule.")]) as llm:
        settings = settings_for(
            root,
            FARMHOST_AGENT_RUNTIME="bwrap",
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_API_KEY=SECRETS["FARMHOST_LLM_API_KEY"],
            FARMHOST_LLM_MODEL="farm-model",
        )
        port = int(llm.base_url.rsplit(":", 1)[1].split("/")[0])
        seen, _ = await run_probe(
            settings, "field", openai="is the irrigation on schedule?", tcp=["127.0.0.1", port],
            unix_get=["/workspace/run/llm.sock", "/v1/models"],
        )  # fmt: skip
    assert seen["openai"] == {"content": "Irrigation is on schedule.", "model": "farm-model"}
    (request,) = llm.requests
    assert request.headers["authorization"] == f"Bearer {SECRETS['FARMHOST_LLM_API_KEY']}"
    assert request.model == "farm-model"
    assert seen["tcp"].startswith("error:")  # the endpoint itself is out of reach
    assert seen["unix_get"].startswith("HTTP/1.1 200") and '"id": "farm-model"' in seen["unix_get"]
    assert SECRETS["FARMHOST_LLM_API_KEY"] not in json.dumps(seen)


def _plant_python(workspace: Path) -> None:
    """What an earlier run (of kind command or opencode: any code) could leave for Python to pick up from its cwd/HOME."""
    fake = 'print(\'{"status": "ok", "answer": "PLANTED-RUNNER"}\')\n'
    (workspace / "farmagent").mkdir(parents=True)
    (workspace / "farmagent" / "__init__.py").write_text("")
    (workspace / "farmagent" / "run.py").write_text(fake)
    (workspace / "json.py").write_text("raise SystemExit('PLANTED-JSON')\n")
    site = workspace / ".local" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    site.mkdir(parents=True)
    (site / "planted.pth").write_text("import sys; sys.stderr.write('PLANTED-PTH\\n')\n")


async def test_the_real_runner_answers_from_its_sandbox_whatever_the_workspace_holds(root: Path) -> None:
    """`python -m farmagent.run` in bwrap: the AgentInput in, one LLM turn through the proxy, the answer out.

    The runner's cwd and HOME are the group's workspace, which the agent writes: a package, a module or a user site
    left there must not be imported in place of the host's runner.
    """
    _plant_python(root / "groups" / "field")
    with ScriptedLLM([Reply("The field pumps ran for 20 minutes.")]) as llm:
        settings = settings_for(
            root,
            FARMHOST_AGENT_RUNTIME="bwrap",
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_API_KEY=SECRETS["FARMHOST_LLM_API_KEY"],
            FARMHOST_LLM_MODEL="farm-model",
        )
        runtime = make_runtime(settings, command=None)
        await runtime.start()
        try:
            outcome = await runtime.submit(
                AgentJob(folder="field", prompt="how long did the pumps run?", scheduled=True)
            )
        finally:
            await runtime.stop()
    assert outcome.status == "ok", outcome.log_path.read_text()
    assert outcome.answer == "The field pumps ran for 20 minutes." and outcome.exit_code == 0
    (request,) = llm.requests
    assert "how long did the pumps run?" in request.text() and request.model == "farm-model"
    log = outcome.log_path.read_text()
    assert "-I -m farmagent.run" in log and "llm: 1 request(s), 0 refused" in log
    assert "PLANTED" not in log, log[-3000:]
    # Where the time went: the host's phases (in the outcome and the log) and the runner's own timing line.
    assert list(outcome.phases_ms) == ["hook", "memory", "sandbox", "agent", "cleanup", "log"], outcome.phases_ms
    assert all(ms >= 0 for ms in outcome.phases_ms.values())
    assert outcome.phases_ms["agent"] <= outcome.duration_seconds * 1000
    assert re.search(
        r"^host: hook \d+ ms, memory \d+ ms, sandbox \d+ ms, agent \d+ ms, cleanup \d+ ms$", log, re.MULTILINE
    ), log
    assert re.search(r"timing: 1 LLM request\(s\) in \d+ ms, 0 tool call\(s\) in 0 ms", log), log


async def test_an_agent_cannot_rewrite_the_logs_of_its_runs(root: Path, sandbox: Sandbox) -> None:
    """Run logs are the host's: a later run of the group finds no log to rewrite, in bwrap and in a container."""
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        first = await runtime.submit(probe_job("field", stderr=["the first run's own words"]))
        log = first.log_path.read_text()
        name = first.log_path.name
        planted = [f"/workspace/group/logs/{name}", f"/workspace/ipc/logs/{name}", f"/workspace/run/{name}"]
        second = report(await runtime.submit(probe_job("field", write=planted, list=["/workspace/group"])))
    finally:
        await runtime.stop()
    assert "the first run's own words" in log
    assert first.log_path.read_text() == log, "the agent rewrote its earlier run's log"
    assert first.log_path.is_relative_to(root / "logs" / "runs" / "field"), first.log_path
    assert "logs" not in second["list"]["/workspace/group"]  # nothing of the host's logs is in its workspace
    if os.geteuid() == 0:  # the log is root's; the agent runs as another uid
        assert first.log_path.stat().st_uid == 0 != second["uid"]
