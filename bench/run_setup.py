"""What a bwrap run's set-up and clean-up cost the host with many files in the group's workspace (issue 33).

Run from the repository root with the project's interpreter (as root: the journal is a root daemon's)::

    .venv/bin/python bench/run_setup.py                       # 65,536 and 300,000 files, about a minute
    .venv/bin/python bench/run_setup.py --files 100000
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/run_setup.py   # the same runs on another build

For each count a fresh data dir gets that many empty files (1,000 per directory) in group ``field``'s workspace,
its ``workspaceMb`` raised so that they are under its limit, and an agent that prints its answer and exits, in
bubblewrap through ``AgentRuntime.submit``. Reported per run: the host's ``sandbox`` phase (set-up: the limit
check, the hand-over, the setuid clean-up before the run) and ``cleanup`` phase, as ``AgentRuntime`` records them:

- ``first run``: the host's files are handed to the group's uid (every entry chowned);
- ``new daemon``: a fresh runtime on the same workspace (what every run cost before the journal);
- ``unchanged``: the same runtime's next run;
- ``1,000 new files``: a run that adds 1,000 files (its clean-up walks them), then ``after it`` the next run.

It reports and never gates: exit 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from farmhost.agents.jobs import AgentJob
from farmhost.agents.runtime import AgentRuntime
from farmhost.config import Settings, build_config
from farmhost.layout import DataLayout
from farmhost.store.db import Database
from farmhost.store.groups import list_groups
from farmhost_dev.testing import init_data_dir_in_process

AGENT = r"""
import json, os, sys
made = json.loads(sys.stdin.read() or "{}").get("prompt", "")
if made:
    os.makedirs(made)
    for index in range(1000):
        open(f"{made}/f{index}", "w").close()
print(json.dumps({"status": "ok", "answer": "done", "error": None, "turns": 1, "toolCalls": 0}))
"""


def _fill(workspace: Path, files: int) -> None:
    for start in range(0, files, 1000):
        folder = workspace / "many" / f"d{start // 1000}"
        folder.mkdir(parents=True)
        for index in range(min(1000, files - start)):
            os.close(os.open(folder / f"f{index}", os.O_CREAT | os.O_WRONLY, 0o644))


async def _no_hook(folder: str) -> None:
    return None


async def _no_memory(folder: str, prompt: str) -> list[dict[str, str]]:
    return []


def _runtime(data_dir: Path) -> AgentRuntime:
    settings = Settings(_env_file=None, FARMHOST_DATA_DIR=data_dir, FARMHOST_AGENT_RUNTIME="bwrap", TZ="UTC")  # type: ignore[call-arg]
    db = Database.open(data_dir)
    try:
        groups = {g.folder: g for g in list_groups(db.conn)}
    finally:
        db.close()
    return AgentRuntime(
        settings=build_config(settings).agents,
        layout=DataLayout(data_dir),
        group=groups.get,
        before_run=_no_hook,
        memory_snippets=_no_memory,
        command=(sys.executable, "-c", AGENT),
    )


async def _run(runtime: AgentRuntime, prompt: str = "") -> tuple[float, float]:
    outcome = await runtime.submit(AgentJob(folder="field", prompt=prompt, scheduled=False))
    if outcome.status != "ok":
        raise SystemExit(f"the run failed: {outcome.error}")
    return outcome.phases_ms["sandbox"], outcome.phases_ms["cleanup"]


async def _measure(files: int) -> dict[str, tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="farmhost-bench-") as tmp:
        data_dir = init_data_dir_in_process(Path(tmp) / "data")
        _fill(data_dir / "groups" / "field", files)
        workspace_mb = 2 * (files // 64 + 1000)  # twice what the files need (64 per MiB), plus the runs' own
        (data_dir / "agent-limits.json").write_text(json.dumps({"groups": {"field": {"workspaceMb": workspace_mb}}}))
        rows: dict[str, tuple[float, float]] = {}
        for name in ("first run", "new daemon"):
            runtime = _runtime(data_dir)
            await runtime.start()
            try:
                rows[name] = await _run(runtime)
                if name == "new daemon":
                    rows["unchanged"] = await _run(runtime)
                    rows["1,000 new files"] = await _run(runtime, "/workspace/group/new")
                    rows["after it"] = await _run(runtime)
            finally:
                await runtime.stop()
        return rows


def main() -> int:
    """Measure and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, action="append", help="files in the workspace (repeatable)")
    args = parser.parse_args()
    print("| files | run | set-up (sandbox) | clean-up |")
    print("|---|---|---|---|")
    for files in args.files or [65_536, 300_000]:
        for name, (setup, cleanup) in asyncio.run(_measure(files)).items():
            print(f"| {files:,} | {name} | {setup:,.0f} ms | {cleanup:,.0f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
