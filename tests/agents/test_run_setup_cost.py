"""A run's set-up and clean-up cost what changed since the last run, not what the group holds (issue 33).

Real runs in bwrap (and a container of the agent image where an engine runs) under a root daemon, whose runs have
their group's own uid: an unchanged workspace of 100,000 files is not walked again, and what a run changes is, at
any place in the tree: new setuid files and setuid bits on files it did not create are cleared, new files and
bytes written into existing files count against the group's limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import PROBE_COMMAND, Sandbox, probe_job, report

from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.group_disk import FILES_PER_MB
from farmhost.agents.sandbox.mounts import GROUP_DIR, IPC_DIR

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the journal is a root daemon's (per-group uids)")

SETID = stat.S_ISUID | stat.S_ISGID


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


def _files(top: Path, dirs: int, per_dir: int) -> None:
    for d in range(dirs):
        (top / f"d{d}").mkdir(parents=True)
        for f in range(per_dir):
            os.close(os.open(top / f"d{d}" / f"f{f}", os.O_CREAT | os.O_WRONLY, 0o644))


async def test_setup_after_an_unchanged_workspace_of_100000_files_walks_only_what_changed(root: Path) -> None:
    bwrap = Sandbox("bwrap", {"FARMHOST_AGENT_RUNTIME": "bwrap"}, PROBE_COMMAND, {})
    _files(root / "groups" / "field" / "many", 100, 1000)
    # 100,001 entries need 1,563 MiB at FILES_PER_MB; 2 GiB leaves room for the runs' own files.
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 2048}}}')
    settings = bwrap.settings(root)
    first = bwrap.runtime(settings)
    await first.start()
    try:
        handed = await first.submit(probe_job("field"))  # hands the host's 100,000 files to the group's uid
        assert handed.status == "ok", handed.error
    finally:
        await first.stop()
    # A daemon that starts anew knows nothing: its first run walks everything (no chown left to do).
    runtime: AgentRuntime = bwrap.runtime(settings)
    await runtime.start()
    try:
        full = await runtime.submit(probe_job("field"))
        assert full.status == "ok", full.error
        assert runtime.trees.setup_walked >= 100_000, runtime.trees.setup_walked
        assert 0 <= runtime.trees.cleanup_walked < 100, "the run changed almost nothing"
        again_ms = []
        for _ in range(2):  # the better of two, so that one slow thread start on a loaded machine does not count
            again = await runtime.submit(probe_job("field"))
            assert again.status == "ok", again.error
            assert 0 <= runtime.trees.setup_walked < 100, runtime.trees.setup_walked
            again_ms.append(again.phases_ms["sandbox"])
    finally:
        await runtime.stop()
    full_ms, again_ms = full.phases_ms["sandbox"], min(again_ms)
    print(f"set-up: full walk {full_ms:.0f} ms, after an unchanged workspace {again_ms:.0f} ms")
    assert again_ms < full_ms / 4, (again_ms, full_ms)


async def test_what_a_run_changes_deep_in_the_tree_is_walked(root: Path, sandbox: Sandbox) -> None:
    workspace, ipc = root / "groups" / "field", root / "ipc" / "field"
    deep = workspace / "a" / "b" / "c" / "d" / "e"
    deep.mkdir(parents=True)
    (workspace / "tools").mkdir()
    (workspace / "tools" / "old").write_text("#!/bin/sh\nid\n")
    _files(workspace / "bulk", 10, 100)
    # 10,000 more files than the group holds now would pass this limit (FILES_PER_MB per MiB).
    limit_mb = (1_000 + 10 + 10 + 9_000) // FILES_PER_MB
    (root / "agent-limits.json").write_text(f'{{"groups": {{"field": {{"workspaceMb": {limit_mb}}}}}}}')
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        built = await runtime.submit(probe_job("field"))
        assert built.status == "ok", built.error
        todo = {
            "setid_file": f"{GROUP_DIR}/a/b/c/d/e/new-sh",
            "chmod_setid": [f"{GROUP_DIR}/tools/old"],
            "many_files": {f"{IPC_DIR}/hoard/x": 10_000},
        }
        changed = await runtime.submit(probe_job("field", **todo))
        assert report(changed)["setid_mode"] == "0o6755", "inside the run the agent may set the bits"
        walked = runtime.trees.cleanup_walked
        assert 10_000 <= walked < 10_500, f"the clean-up walked what changed, not the 1,000 bulk files: {walked}"
        for made in (deep / "new-sh", workspace / "tools" / "old"):
            assert stat.S_IMODE(made.lstat().st_mode) & SETID == 0, (made, oct(made.lstat().st_mode))
        refused = await runtime.submit(probe_job("field"))
        assert refused.status == "error" and refused.error is not None, refused
        assert f"over its limit of {limit_mb * FILES_PER_MB} ({FILES_PER_MB} per MiB" in refused.error, refused.error
        assert f"{ipc}/hoard (" in refused.error, refused.error
    finally:
        await runtime.stop()


async def test_bytes_written_into_an_existing_file_count(root: Path, sandbox: Sandbox) -> None:
    log = root / "groups" / "field" / "data" / "log.bin"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"x" * 1024)
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 2}}}')
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        assert (await runtime.submit(probe_job("field"))).status == "ok"
        grown = await runtime.submit(probe_job("field", grow={f"{GROUP_DIR}/data/log.bin": 3}))
        assert grown.status == "ok", grown.error
        refused = await runtime.submit(probe_job("field"))
        assert refused.status == "error" and refused.error is not None, refused
        assert "over its limit of 2 MiB" in refused.error and f"{log.parent} (3 MiB)" in refused.error, refused.error
        log.unlink()
        assert (await runtime.submit(probe_job("field"))).status == "ok", "deleted, the group runs again"
    finally:
        await runtime.stop()


async def test_a_run_cannot_give_a_file_a_second_name(root: Path, sandbox: Sandbox) -> None:
    """A hard link would let a run write into a file of a directory it leaves unchanged: the filter refuses it."""
    (root / "groups" / "field" / "data").mkdir(parents=True)
    (root / "groups" / "field" / "data" / "log").write_text("x")
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        todo = {"hardlink": [f"{GROUP_DIR}/data/log", f"{GROUP_DIR}/other-name"]}
        seen = report(await runtime.submit(probe_job("field", **todo)))
    finally:
        await runtime.stop()
    assert seen["hardlink"] == "error:EPERM", seen["hardlink"]
    assert not (root / "groups" / "field" / "other-name").exists()


async def test_a_run_that_churns_past_the_kernels_event_queue_is_walked_whole_once(root: Path) -> None:
    """20,000 files made in a directory the journal watches overflow the kernel's queue (16,384 events here).

    The clean-up walks the trees whole into a fresh journal, clearing what the run left; the next set-up then
    walks only what changed since.
    """
    bwrap = Sandbox("bwrap", {"FARMHOST_AGENT_RUNTIME": "bwrap"}, PROBE_COMMAND, {})
    (root / "groups" / "field" / "busy").mkdir(parents=True)
    runtime = bwrap.runtime(bwrap.settings(root))
    await runtime.start()
    try:
        assert (await runtime.submit(probe_job("field"))).status == "ok"
        todo = {"many_files": {f"{GROUP_DIR}/busy": 20_000}, "setid_file": f"{GROUP_DIR}/busy/sh"}
        churned = await runtime.submit(probe_job("field", **todo))
        assert churned.status == "ok", churned.error
        assert runtime.trees.cleanup_walked == -1, "the events were lost: walked whole"
        made = root / "groups" / "field" / "busy" / "sh"
        assert stat.S_IMODE(made.lstat().st_mode) & SETID == 0, oct(made.lstat().st_mode)
        after = await runtime.submit(probe_job("field"))
        assert after.status == "ok", after.error
        assert 0 <= runtime.trees.setup_walked < 100, runtime.trees.setup_walked
    finally:
        await runtime.stop()


async def test_a_run_cannot_give_its_files_away(root: Path, sandbox: Sandbox) -> None:
    """The ownership of an entry cannot change inside a run: no other uid, no group but its own."""
    (root / "groups" / "field" / "data").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / "groups" / "field" / "data" / name).write_text("x")
    runtime = sandbox.runtime(sandbox.settings(root))
    await runtime.start()
    try:
        first = report(await runtime.submit(probe_job("field")))
        uid = first["uid"]
        todo = {"chown": {f"{GROUP_DIR}/data/a": [0, 0], f"{GROUP_DIR}/data/b": [uid + 1, -1],
                          f"{GROUP_DIR}/data/c": [-1, 0]}}  # fmt: skip
        seen = report(await runtime.submit(probe_job("field", **todo)))
    finally:
        await runtime.stop()
    assert set(seen["chown"].values()) == {"error:EPERM"}, seen["chown"]
    for name in ("a", "b", "c"):
        info = (root / "groups" / "field" / "data" / name).lstat()
        assert (info.st_uid, info.st_gid) == (uid, uid), (name, info.st_uid, info.st_gid)
