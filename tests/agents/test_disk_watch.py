"""A run's disk while it goes on (farmhost/agents/disk_watch.py): real runs in the sandbox write into their workspace.

Before, the group's limit was measured only before each run and nothing watched the host's free space: a run
writing without stopping went on until its wall time (600 s) and could fill the disk of the database and HA.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process
from runtime_support import Sandbox, probe_job, report

from farmhost.agents.jobs import AgentOutcome
from farmhost.agents.runtime import AgentRuntime
from farmhost.agents.sandbox.mounts import GROUP_DIR

WALL_TIME = 120  # far beyond what any of these runs takes: a run ended "before it" was ended by the watch


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def _run(root: Path, sandbox: Sandbox, todo: dict[str, Any], **values: Any) -> tuple[AgentOutcome, AgentRuntime]:
    runtime = sandbox.runtime(sandbox.settings(root, FARMHOST_AGENT_TIMEOUT_SECONDS=WALL_TIME, **values))
    await runtime.start()
    try:
        return await runtime.submit(probe_job("field", **todo)), runtime
    finally:
        await runtime.stop()


def _written_mb(path: Path) -> float:
    """What the run left in `path` (then deleted: tmp_path is kept after the test), in MiB."""
    try:
        size = path.stat().st_size / 2**20
    except FileNotFoundError:
        return 0.0
    path.unlink()
    return size


async def test_a_run_writing_past_its_groups_limit_is_ended_with_why(root: Path, sandbox: Sandbox) -> None:
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 8}}}')
    big = root / "groups" / "field" / "big"
    try:
        # 40 MB a second for 10 s: unwatched, the run ends ok having written 400 MB
        outcome, _ = await _run(root, sandbox, {"trickle": [f"{GROUP_DIR}/big", 40, 400]})
    finally:
        written = _written_mb(big)
    assert outcome.status == "error", outcome
    assert outcome.error is not None and outcome.error.startswith("the run was ended: the group's "), outcome.error
    assert "over its limit of 8 MiB (agent-limits.json workspaceMb)" in outcome.error, outcome.error
    assert f"are in {big} (" in outcome.error, outcome.error
    assert outcome.duration_seconds < WALL_TIME / 2, outcome
    assert written < 400, written
    assert outcome.error in outcome.log_path.read_text()
    print(f"ended at {written:.0f} MiB written under a limit of 8 MiB, after {outcome.duration_seconds:.1f} s")


async def test_a_run_is_ended_when_the_disk_reaches_its_reserve(root: Path, sandbox: Sandbox) -> None:
    info = os.statvfs(root)
    free_mb = info.f_bavail * info.f_frsize // 2**20
    assert free_mb >= 400, f"{root} has {free_mb} MB free: the test writes up to 300 MB there (TMPDIR)"
    reserve = free_mb - 40  # ~40 MB written (less if something else writes meanwhile) reach it
    big = root / "groups" / "field" / "big"
    try:
        outcome, _ = await _run(
            root, sandbox, {"trickle": [f"{GROUP_DIR}/big", 40, 300]}, FARMHOST_DISK_RESERVE_MB=reserve
        )
    finally:
        written = _written_mb(big)
    assert outcome.status == "error", outcome
    assert outcome.error is not None and outcome.error.startswith(
        f"the run was ended: the disk holding the data directory ({root}) has only "
    ), outcome.error
    assert f"MB free (reserve {reserve} MB, FARMHOST_DISK_RESERVE_MB)" in outcome.error, outcome.error
    assert outcome.duration_seconds < WALL_TIME / 2, outcome
    assert written < 300, written
    print(f"ended at {written:.0f} MiB written, 40 MB from the reserve, after {outcome.duration_seconds:.1f} s")


async def test_a_run_within_its_limits_is_watched_and_not_ended(
    root: Path, sandbox: Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "agent-limits.json").write_text('{"groups": {"field": {"workspaceMb": 8}}}')
    with caplog.at_level(logging.DEBUG, logger="farmhost.agents.disk_watch"):
        outcome, _ = await _run(root, sandbox, {"trickle": [f"{GROUP_DIR}/notes", 8, 4], "sleep": 3})
    assert report(outcome)["trickled"] == 4
    walks = [r.getMessage() for r in caplog.records if "its group holds" in r.getMessage()]
    assert walks and all("of 8 MiB" in w for w in walks), "the group's disk was walked while the run went on"
    assert (root / "groups" / "field" / "notes").stat().st_size == 4 * 2**20
