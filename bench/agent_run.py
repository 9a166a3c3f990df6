"""Agent run benchmark: what one agent run costs the host, per sandbox, against a plain interpreter start.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/agent_run.py              # 15 runs per row, about a minute
    .venv/bin/python bench/agent_run.py --runs 5

Every row goes through `farmhost.agents.AgentRuntime.submit` on a fresh temporary data directory, so it
includes what a real run does: the snapshot hook, the memory search for the prompt, the sandbox, the LLM
proxy socket, the run log. The LLM is the scripted chat-completions server of the test suite on 127.0.0.1
answering at once, so the figures are farmhost's and the runner's overhead, not a model's thinking time.

- ``python -c pass``: the interpreter alone, started the way the process backend starts it (the floor);
- ``process``: the real runner (`python -m farmagent.run`) without isolation, one tool call then an answer;
- ``bwrap``: the same run in a bubblewrap sandbox (namespaces, mounts, no network);
- ``bwrap, 4 groups at once``: four groups submitted together with FARMHOST_MAX_AGENTS=2 (wall time for all).

The script reports; it never gates: the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # farmhost_dev: the dev tools at the repo root

from farmhost.agents import AgentJob, AgentRuntime
from farmhost.config import Settings
from farmhost.layout import DataLayout
from farmhost.memory.search import MemoryService
from farmhost.store.db import Database
from farmhost.store.groups import Group, list_groups
from farmhost_dev.llm_stub import Reply, ScriptedLLM, ToolCall
from farmhost_dev.testing import init_data_dir_in_process, register_in_process, running_daemon


def _settings(data_dir: Path, runtime: str, llm: ScriptedLLM, max_agents: int = 2) -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        FARMHOST_DATA_DIR=data_dir,
        TZ="Europe/Lisbon",
        FARMHOST_AGENT_RUNTIME=runtime,
        FARMHOST_MAX_AGENTS=max_agents,
        FARMHOST_LLM_BASE_URL=llm.base_url,
        FARMHOST_LLM_MODEL="bench-model",
        FARMHOST_LLM_API_KEY="sk-bench",
    )


def _add_groups(data_dir: Path, count: int) -> list[str]:
    folders = [f"bench{i}" for i in range(count)]
    for i, folder in enumerate(folders):
        register_in_process(data_dir, jid=f"telegram:9{i}", name=folder, folder=folder)
    return folders


def _lookup(data_dir: Path) -> dict[str, Group]:
    db = Database.open(data_dir)
    try:
        return {g.folder: g for g in list_groups(db.conn)}
    finally:
        db.close()


async def _no_hook(folder: str) -> None:
    return None


def _runtime(settings: Settings, command: Sequence[str] | None = None) -> AgentRuntime:
    groups = _lookup(settings.data_dir)
    memory = MemoryService(DataLayout(settings.data_dir))
    return AgentRuntime(
        settings=settings,
        layout=DataLayout(settings.data_dir),
        group=groups.get,
        before_run=_no_hook,
        memory_snippets=lambda folder, prompt: memory.search(folder, prompt, top_k=8, sources="memory"),
        command=command,
    )


async def _timed_runs(runtime: AgentRuntime, folder: str, runs: int) -> list[float]:
    await runtime.start()
    times = []
    try:
        for _ in range(runs):
            start = time.perf_counter()
            outcome = await runtime.submit(
                AgentJob(folder=folder, prompt="how dry is the north field?", scheduled=True)
            )
            times.append(time.perf_counter() - start)
            if outcome.status != "ok":
                raise SystemExit(f"run failed: {outcome.error}")
    finally:
        await runtime.stop()
    return times


async def _parallel(runtime: AgentRuntime, folders: list[str], rounds: int) -> list[float]:
    await runtime.start()
    times = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            jobs = [AgentJob(folder=f, prompt="check the pump", scheduled=False) for f in folders]
            outcomes = await asyncio.gather(*(runtime.submit(j) for j in jobs))
            times.append(time.perf_counter() - start)
            failed = [o.error for o in outcomes if o.status != "ok"]
            if failed:
                raise SystemExit(f"run failed: {failed[0]}")
    finally:
        await runtime.stop()
    return times


def _row(name: str, seconds: list[float], note: str) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return {"name": name, "n": len(ms), "p50": statistics.median(ms), "p95": p95, "note": note}


def _measure(data_dir: Path, llm: ScriptedLLM, folders: list[str], runs: int) -> list[dict[str, Any]]:
    script = [ToolCall("memory_search", {"query": "north field"}), Reply("The north field is at 31 %.")]
    floor = _runtime(_settings(data_dir, "process", llm), command=[sys.executable, "-c", FLOOR])
    rows = [_row("python -c pass", asyncio.run(_timed_runs(floor, "field", runs)), "interpreter only")]
    for name in ("process", "bwrap"):
        if name == "bwrap" and shutil.which("bwrap") is None:
            print("bwrap: not installed (apt-get install bubblewrap)")
            continue
        llm.script(*(script * runs))
        times = asyncio.run(_timed_runs(_runtime(_settings(data_dir, name, llm)), "field", runs))
        answered = [r for r in llm.requests if "tomatoes" in (r.last_tool_result() or "")]
        if len(answered) < runs:
            raise SystemExit("memory_search did not reach the daemon")
        llm.requests.clear()
        rows.append(_row(name, times, "farmagent runner, 2 LLM requests, 1 memory_search through the daemon"))
    if shutil.which("bwrap"):
        runtime = _runtime(_settings(data_dir, "bwrap", llm, max_agents=2))
        times = asyncio.run(_parallel(runtime, folders, max(3, runs // 3)))
        rows.append(_row("bwrap, 4 groups at once", times, "wall time for all 4, FARMHOST_MAX_AGENTS=2"))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="runs per row (default 15)")
    args = parser.parse_args(argv)
    print(
        f"agent run benchmark: {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp, ScriptedLLM(then=Reply("done")) as llm:
        data_dir = init_data_dir_in_process(Path(tmp) / "data")
        (data_dir / "groups" / "field" / "MEMORY.md").write_text("# Fields\nThe north field has tomatoes.\n")
        folders = _add_groups(data_dir, 4)
        with running_daemon(data_dir):  # answers the runs' memory_search requests, as in production
            rows = _measure(data_dir, llm, folders, args.runs)
    print(f"\n| {'measure':<24} | {'n':>3} | {'p50 ms':>8} | {'p95 ms':>8} | note |")
    print(f"|{'-' * 26}|{'-' * 4}:|{'-' * 9}:|{'-' * 9}:|------|")
    for r in rows:
        print(f"| {r['name']:<24} | {r['n']:>3} | {r['p50']:>8.0f} | {r['p95']:>8.0f} | {r['note']} |")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\nlargest child process (an agent run, or bwrap around it): {peak:.0f} MB peak RSS")
    return 0


# The floor prints a valid AgentResult so the runtime treats it like any run.
FLOOR = (
    'import sys; sys.stdin.read(); print(\'{"status": "ok", "answer": "", "error": null, "turns": 0, "toolCalls": 0}\')'
)


if __name__ == "__main__":
    raise SystemExit(main())
