"""What a run may use, enforced in real runs: never host root, capped tmpfs, processes, memory, CPU, quota, budget.

Each run-level case runs in bwrap and in a container of the agent image (the `sandbox` fixture; docker skips without
an engine), so both backends are held to the same limits.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process, scaled, wait_for_async
from llm_stub import Reply, ScriptedLLM
from runtime_support import Sandbox, probe_job, report

from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.backends.base import RunLimits, SandboxError
from farmhost.agents.sandbox.cgroups import CgroupSupport, detect_sync, open_run_cgroup_sync, own_paths
from farmhost.agents.sandbox.mounts import GROUP_DIR, IPC_DIR


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def _run(root: Path, sandbox: Sandbox, folder: str = "field", **values: Any) -> tuple[Any, AgentRuntime]:
    todo = values.pop("todo")
    runtime = sandbox.runtime(sandbox.settings(root, **values))
    await runtime.start()
    try:
        return await runtime.submit(probe_job(folder, **todo)), runtime
    finally:
        await runtime.stop()


async def test_an_agent_is_never_host_root_and_its_setuid_bits_do_not_survive(root: Path, sandbox: Sandbox) -> None:
    outcome, _ = await _run(root, sandbox, todo={"setid_file": f"{GROUP_DIR}/sh-root"})
    seen = report(outcome)
    made = root / "groups" / "field" / "sh-root"
    info = made.lstat()
    if os.geteuid() == 0:
        # A root daemon's runs drop to an unprivileged uid: what they create is not root's.
        assert seen["uid"] != 0 and info.st_uid == seen["uid"] and info.st_uid != 0, (seen["uid"], info.st_uid)
        workspace = (root / "groups" / "field").stat()
        assert workspace.st_uid == seen["uid"], "the workspace was handed to the agent's uid"
    else:
        assert info.st_uid == os.geteuid()  # an unprivileged daemon's runs keep its uid
    assert seen["setid_mode"] == "0o6755", "inside the run the agent may set the bits"
    assert stat.S_IMODE(info.st_mode) & (stat.S_ISUID | stat.S_ISGID) == 0, oct(info.st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="a setuid-root copy and another local user need a root daemon")
async def test_a_setuid_file_in_the_workspace_gives_nobody_its_owner(sandbox: Sandbox) -> None:
    """During a run nobody gains the uid of a setuid file in the workspace.

    A local user cannot reach the agent's setuid file, and a setuid-root program put in the workspace runs without
    root inside the run (nosuid binds in bwrap, no-new-privileges in both).
    """
    base = Path(tempfile.mkdtemp(prefix="farmhost-setuid-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)  # a data dir others could walk into, as `make run` or the demo as root make it
        root = init_data_dir_in_process(base / "data")
        os.chmod(root, 0o755)
        runtime = sandbox.runtime(sandbox.settings(root))
        await runtime.start()
        try:
            job = probe_job("field", setid_file=f"{GROUP_DIR}/sh-agent", exec_when=f"{GROUP_DIR}/id-root")
            run = asyncio.create_task(runtime.submit(job))
            workspace = root / "groups" / "field"
            await wait_for_async(lambda: (workspace / "id-root.ready").exists() or None, timeout=scaled(30),
                                 what="the probe to be ready")  # fmt: skip
            with pytest.raises(PermissionError):  # its parents are closed to other users
                await asyncio.to_thread(
                    subprocess.run, [str(workspace / "sh-agent")], user=4242, group=4242, capture_output=True
                )
            copy = workspace / ".id-root.tmp"
            shutil.copy("/usr/bin/id", copy)
            os.chmod(copy, 0o4755)
            os.rename(copy, workspace / "id-root")
            seen = report(await run)
        finally:
            await runtime.stop()
    finally:
        shutil.rmtree(base)
    assert seen["setid_mode"] == "0o6755"
    assert seen["exec"].split()[0].split("(")[0] == f"uid={seen['uid']}" and "euid" not in seen["exec"], seen["exec"]


def _deep_mode(top: Path, levels: int) -> int:
    """The mode of `sh-root` below `levels` directories of the probe's deep chain, reached by descriptors."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            below = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.stat("sh-root", dir_fd=fd, follow_symlinks=False).st_mode
    finally:
        os.close(fd)


async def test_setuid_bits_deeper_than_path_max_are_cleared_and_lock_nobody_out(root: Path, sandbox: Sandbox) -> None:
    """A setuid file below 8 KiB of directory names, in the workspace and the IPC dir, is cleared after the run.

    And the group's next run starts: the host walks by descriptors, never by paths that long.
    """
    deep = {GROUP_DIR: 8192, IPC_DIR: 8192}
    first, _ = await _run(root, sandbox, todo={"deep_setid": deep})
    made = report(first)["deep_setid"]
    assert made == {GROUP_DIR: [8241, "0o6755"], IPC_DIR: [8241, "0o6755"]}, made
    for host in (root / "groups" / "field", root / "ipc" / "field"):
        mode = _deep_mode(host, 8241 // 201)
        assert stat.S_IMODE(mode) & (stat.S_ISUID | stat.S_ISGID) == 0, (host, oct(mode))
    second, _ = await _run(root, sandbox, todo={})
    assert second.status == "ok", second.error


async def test_the_host_walk_follows_no_link_the_agent_planted(root: Path, tmp_path: Path, sandbox: Sandbox) -> None:
    """Links to a setuid file and a directory of the host: neither is chowned, cleared nor walked into."""
    victim = tmp_path / "victim"
    victim.write_text("#!/bin/sh\n")
    os.chmod(victim, 0o4755)
    (tmp_path / "host-dir").mkdir()
    (tmp_path / "host-dir" / "inner").write_text("x")
    os.chmod(tmp_path / "host-dir" / "inner", 0o2755)
    before = [(p.stat().st_uid, p.stat().st_mode) for p in (victim, tmp_path / "host-dir" / "inner")]
    links = {f"{GROUP_DIR}/victim": str(victim), f"{IPC_DIR}/host-dir": str(tmp_path / "host-dir")}
    first, _ = await _run(root, sandbox, todo={"symlink": links})
    second, _ = await _run(root, sandbox, todo={})  # its set-up walks the links again
    assert first.status == second.status == "ok", (first.error, second.error)
    assert [(p.stat().st_uid, p.stat().st_mode) for p in (victim, tmp_path / "host-dir" / "inner")] == before


async def test_tmp_and_shared_memory_are_capped(root: Path, sandbox: Sandbox) -> None:
    fill = {"/tmp/big": 64, "/dev/shm/big": 64}
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_TMP_MB=8, todo={"fill": fill})
    seen = report(outcome)["fill"]
    for path in fill:
        error, written = seen[path]
        assert error == "error:ENOSPC" and written <= 8 * 1024 * 1024, (path, seen[path])


async def test_a_workspace_over_its_limit_refuses_the_run_and_says_why(root: Path, sandbox: Sandbox) -> None:
    (root / "groups" / "field" / "harvest.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 2}}}')
    outcome, _ = await _run(root, sandbox, todo={})
    assert outcome.status == "error", outcome
    assert outcome.error is not None and "hold at least 3 MiB, over its limit of 2 MiB" in outcome.error
    assert f"are in {root / 'groups' / 'field' / 'harvest.bin'} (3 MiB)" in outcome.error
    main, _ = await _run(root, sandbox, "main", todo={})  # the limit is the group's
    assert main.status == "ok", main


async def test_processes_are_capped(root: Path, sandbox: Sandbox) -> None:
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_PIDS=32, todo={"forks": 300})
    forked, error = report(outcome)["forks"]
    assert forked < 32 and error == "error:EAGAIN", (forked, error)


async def test_memory_is_summed_over_a_runs_processes(root: Path, sandbox: Sandbox) -> None:
    """Each of 3 processes stays under the per-process limit; together they are over it: the kernel kills."""
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_MEMORY_MB=256, todo={"mem_children": [3, 150]})
    statuses = report(outcome)["mem_children"]
    assert any(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL for s in statuses), statuses


async def test_shared_memory_counts_against_the_run(root: Path, sandbox: Sandbox) -> None:
    """Pages in /dev/shm outlive the process that wrote them; the run is charged for them and ended at its limit."""
    outcome, _ = await _run(
        root, sandbox, FARMHOST_AGENT_MEMORY_MB=128, FARMHOST_AGENT_TMP_MB=1024, todo={"shm_child": 400}
    )
    assert outcome.status == "error", outcome
    assert outcome.error is not None and outcome.error.startswith(
        "the run reached its memory limit (128 MB) and the kernel killed a process"
    ), outcome.error


async def test_a_run_gets_its_cpu_share(root: Path, sandbox: Sandbox) -> None:
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_CPU_PERCENT=50, todo={"cpu_children": [2, 1.5]})
    used, wall = report(outcome)["cpu_children"]
    # Two spinning processes would use 2 s of CPU per second of wall time on two free cores; the run gets half
    # a core. A busy machine gives them less, never more.
    assert used <= 0.5 * wall * 1.25 + 0.2, (used, wall)


async def test_a_groups_daily_llm_budget_holds_over_its_runs(root: Path, sandbox: Sandbox) -> None:
    """The proxy counts the group's requests over its runs: the next run past the budget gets the refusal."""
    (root / "agent-limits.json").write_text('{"groups": {"field": {"llmRequestsPerDay": 1}}}')
    with ScriptedLLM(then=Reply("The pumps are fine.")) as llm:
        llm_settings = {"FARMHOST_LLM_BASE_URL": llm.base_url, "FARMHOST_LLM_MODEL": "farm-model"}
        first, _ = await _run(root, sandbox, todo={"openai": "how are the pumps?"}, **llm_settings)
        second, _ = await _run(root, sandbox, todo={"openai": "and now?"}, **llm_settings)
        other, _ = await _run(root, sandbox, "main", todo={"openai": "and the barn?"}, **llm_settings)
    assert report(first)["openai"] == {"content": "The pumps are fine.", "model": "farm-model"}
    refusal = report(second)["openai"]
    assert refusal.startswith("error:HTTP 429: "), refusal
    assert "group field has used its daily budget of 1 LLM requests; it resets at midnight Europe/Lisbon" in refusal
    assert report(other)["openai"]["content"] == "The pumps are fine."  # the budget is the group's
    assert [r.text() for r in llm.requests] == ["how are the pumps?", "and the barn?"]
    assert "llm: 0 request(s), 1 refused" in second.log_path.read_text()


def test_without_cgroups_a_run_starts_only_if_the_operator_allowed_it(tmp_path: Path) -> None:
    limits = RunLimits(timeout_seconds=10, memory_mb=256, pids=32, max_turns=1)
    lacking = CgroupSupport(version=None, reason="/sys/fs/cgroup/x is not delegated to the daemon")
    with pytest.raises(SandboxError, match="not delegated to the daemon.*FARMHOST_AGENT_UNENFORCED_LIMITS=allow"):
        open_run_cgroup_sync(lacking, "r1", limits, allow_without=False)
    assert open_run_cgroup_sync(lacking, "r1", limits, allow_without=True) is None


def test_detection_names_what_a_cgroup_v2_host_lacks(tmp_path: Path) -> None:
    own = own_paths(Path("/proc/self/cgroup").read_text()).get("", "/").lstrip("/")
    mine = tmp_path / own
    mine.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (mine / "cgroup.controllers").write_text("cpu io\n")
    assert "does not offer the memory, pids controller(s)" in detect_sync(tmp_path).reason
    (mine / "cgroup.controllers").write_text("cpu io memory pids\n")
    (mine / "cgroup.subtree_control").write_text("")
    os.chmod(mine / "cgroup.subtree_control", 0o444)
    support = detect_sync(tmp_path)
    if os.geteuid() != 0:  # root may write any file: for it the read-only file is no obstacle
        assert "is not delegated to the daemon (systemd: Delegate=yes" in support.reason
    else:
        assert support.version == 2 and (mine / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"


async def test_a_python_agent_starts_the_threads_it_needs(root: Path, sandbox: Sandbox) -> None:
    """The memory limit is the cgroup's: 256 MB of memory still leaves room for 100 threads.

    Each thread reserves far more address space than it uses (an 8 MiB stack, a malloc arena).
    """
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_MEMORY_MB=256, todo={"threads": 100})
    seen = report(outcome)
    assert seen["threads"] == [100, None], seen["threads"]  # with RLIMIT_AS at 256 MB: 6
    assert seen["rlimits"]["RLIMIT_AS"] == -1  # unlimited: the cgroup holds the memory


async def test_one_process_over_the_memory_limit_ends_the_run(root: Path, sandbox: Sandbox) -> None:
    """Without RLIMIT_AS, one process past the run's memory is the cgroup's to stop: the kernel kills it."""
    outcome, _ = await _run(root, sandbox, FARMHOST_AGENT_MEMORY_MB=128, todo={"mem_children": [1, 200]})
    [status] = report(outcome)["mem_children"]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
