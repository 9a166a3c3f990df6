"""A group's limit on disk covers its workspace and its IPC directory, in bytes and in files (issue 33, finding 2).

Real runs in bwrap (and a container of the agent image where an engine runs): a group over its limit is refused
before its run with what to delete, and runs again once it is deleted.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import Sandbox, probe_job

from farmhost.agents.sandbox.group_disk import FILES_PER_MB, MAX_DEPTH


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
