"""What a run may use, enforced by the kernel in real bwrap runs: never host root, capped tmpfs, processes, quota."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import make_runtime, probe_job, report, settings_for

from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox import GROUP_DIR


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def _run(root: Path, folder: str = "field", **values: Any) -> tuple[Any, AgentRuntime]:
    todo = values.pop("todo")
    runtime = make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", **values))
    await runtime.start()
    try:
        return await runtime.submit(probe_job(folder, **todo)), runtime
    finally:
        await runtime.stop()


async def test_an_agent_is_never_host_root_and_its_setuid_bits_do_not_survive(root: Path) -> None:
    outcome, _ = await _run(root, todo={"setid_file": f"{GROUP_DIR}/sh-root"})
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


async def test_tmp_and_shared_memory_are_capped(root: Path) -> None:
    fill = {"/tmp/big": 64, "/dev/shm/big": 64}
    outcome, _ = await _run(root, FARMHOST_AGENT_TMP_MB=8, todo={"fill": fill})
    seen = report(outcome)["fill"]
    for path in fill:
        error, written = seen[path]
        assert error == "error:ENOSPC" and written <= 8 * 1024 * 1024, (path, seen[path])


async def test_a_workspace_over_its_limit_refuses_the_run_and_says_why(root: Path) -> None:
    (root / "groups" / "field" / "harvest.bin").write_bytes(os.urandom(3 * 1024 * 1024))
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 2}}}')
    outcome, _ = await _run(root, todo={})
    assert outcome.status == "error", outcome
    assert outcome.error is not None and "workspace holds 3 MiB, over its limit of 2 MiB" in outcome.error
    main, _ = await _run(root, "main", todo={})  # the limit is the group's
    assert main.status == "ok", main


async def test_processes_are_capped(root: Path) -> None:
    outcome, _ = await _run(root, FARMHOST_AGENT_PIDS=32, todo={"forks": 300})
    forked, error = report(outcome)["forks"]
    assert forked < 32 and error == "error:EAGAIN", (forked, error)
