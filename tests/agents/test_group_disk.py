"""A group's limit on disk covers every directory its runs can write into, in bytes and in files (issue 33, finding 2).

The workspace and the IPC directory, and for the main group the dashboards. Real runs in bwrap (and a container of
the agent image where an engine runs): a group over its limit is refused before its run with what to delete, and
runs again once it is deleted.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest
from farmhost_testing import clean_env, init_data_dir_in_process, running_daemon, scaled, wait_for
from runtime_support import Sandbox, logged_answer, probe_job, run_logs, schedule_run

from farmhost.agents.sandbox.group_disk import FILES_PER_MB, MAX_DEPTH
from farmhost.agents.sandbox.mounts import DASHBOARD_DIR


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def _run(root: Path, sandbox: Sandbox, folder: str = "field") -> tuple[str, str | None]:
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        outcome = await runtime.submit(probe_job(folder))
    finally:
        await runtime.stop()
    return outcome.status, outcome.error


async def test_bytes_left_in_the_ipc_directory_count_against_the_groups_limit(root: Path, sandbox: Sandbox) -> None:
    hoard = root / "ipc" / "field" / "hoard.bin"
    hoard.parent.mkdir(parents=True, exist_ok=True)
    hoard.write_bytes(os.urandom(3 * 1024 * 1024))
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 2}}}')
    status, error = await _run(root, sandbox)
    assert status == "error" and error is not None, (status, error)
    workspace, ipc = root / "groups" / "field", root / "ipc" / "field"
    assert f"the group's {workspace}/ and {ipc}/ hold at least 3 MiB, over its limit of 2 MiB" in error
    assert (
        "(agent-limits.json workspaceMb); delete files before the next run, the most (counted up to the limit) "
        in error
    )
    assert f"are in {hoard} (3 MiB)" in error
    assert await _run(root, sandbox, "main") == ("ok", None), "the limit is the group's"
    hoard.unlink()
    assert await _run(root, sandbox) == ("ok", None), "deleted, the group runs again"


async def test_empty_files_count_against_the_groups_limit_in_files(root: Path, sandbox: Sandbox) -> None:
    many = root / "groups" / "field" / "many"
    many.mkdir(parents=True)
    for index in range(2 * FILES_PER_MB):
        (many / f"f{index}").touch()
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 1}}}')
    status, error = await _run(root, sandbox)
    assert status == "error" and error is not None, (status, error)
    assert f"hold at least {FILES_PER_MB + 1} files, over its limit of {FILES_PER_MB} ({FILES_PER_MB} per MiB" in error
    assert f"the most (counted up to the limit) are in {many} (" in error
    shutil.rmtree(many)
    assert await _run(root, sandbox) == ("ok", None)


async def test_a_tree_too_deep_to_walk_is_refused_with_where_it_is(root: Path, sandbox: Sandbox) -> None:
    top = root / "groups" / "field" / "deep"
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(MAX_DEPTH + 10):  # made descriptor-relative: the path is longer than PATH_MAX
        os.mkdir("d" * 200, dir_fd=fd)
        child = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    status, error = await _run(root, sandbox)
    assert status == "error" and error is not None, (status, error)
    assert f"hold a tree nested deeper than {MAX_DEPTH} directories in {top}; delete it before the next run" in error


def test_what_a_main_run_writes_into_the_dashboards_counts_against_its_limit(root: Path, sandbox: Sandbox) -> None:
    """Through the daemon: a main run fills /workspace/dashboard past workspaceMb; the next run is refused."""
    (root / "agent-limits.json").write_text('{"groups": {"main": {"workspaceMb": 2}}}')
    env = clean_env(TZ="Europe/Lisbon", **sandbox.values, **sandbox.env, FARMHOST_AGENT_KIND="command",
                    FARMHOST_AGENT_COMMAND=shlex.join(sandbox.command))  # fmt: skip
    big = root / "dashboards" / "big.bin"
    with running_daemon(root, env=env):
        schedule_run(root, json.dumps({"grow": {f"{DASHBOARD_DIR}/big.bin": 3}}), folder="main")
        [first] = wait_for(lambda: run_logs(root, 1, "main"), timeout=scaled(60), what="the first run's log")
        logged_answer(first)
        assert big.stat().st_size == 3 * 2**20
        schedule_run(root, "{}", folder="main")
        [_, second] = wait_for(lambda: run_logs(root, 2, "main"), timeout=scaled(60), what="the second run's log")
        refusal = second.read_text()
        assert "status: error" in refusal, refusal[-3000:]
        assert f"{root / 'dashboards'}/ hold at least 3 MiB, over its limit of 2 MiB" in refusal, refusal[-3000:]
        assert f"are in {big} (3 MiB)" in refusal
        big.unlink()
        schedule_run(root, "{}", folder="main")
        [*_, third] = wait_for(lambda: run_logs(root, 3, "main"), timeout=scaled(60), what="the third run's log")
        logged_answer(third)
