"""Agent run benchmark: what one agent run costs the host, per sandbox, against a plain interpreter start.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/agent_run.py              # 15 runs per row, about a minute
    .venv/bin/python bench/agent_run.py --runs 5

Every row goes through `farmhost.agents.runtime.AgentRuntime.submit` on a fresh temporary data directory, so it
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
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # farmhost_dev: the dev tools at the repo root

from farmhost.agents.jobs import AgentJob
from farmhost.agents.kinds import opencode_binary
from farmhost.agents.runtime import AgentRuntime
from farmhost.config import Settings, build_config
from farmhost.layout import DataLayout
from farmhost.memory.search import MemoryService
from farmhost.store.db import Database
from farmhost.store.groups import Group, list_groups
from farmhost_dev.llm_stub import Reply, ScriptedLLM, ToolCall
from farmhost_dev.testing import init_data_dir_in_process, register_in_process, running_daemon


def _settings(data_dir: Path, runtime: str, llm: ScriptedLLM, max_agents: int = 2, kind: str = "farmagent") -> Settings:
    return Settings(  # type: ignore[call-arg]
        _env_file=None,
        FARMHOST_DATA_DIR=data_dir,
        TZ="Europe/Lisbon",
        FARMHOST_AGENT_RUNTIME=runtime,
        FARMHOST_AGENT_KIND=kind,
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
        settings=build_config(settings).agents,
        layout=DataLayout(settings.data_dir),
        group=groups.get,
        before_run=_no_hook,
        memory_snippets=lambda folder, prompt: memory.search(folder, prompt, top_k=8, sources="memory"),
        command=command,
    )


@dataclass
class Runs:
    """The runs of one row: wall times, the host's phases and the runner's own timing line, per run."""

    seconds: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    runner: list[tuple[float, float]] = field(default_factory=list)  # (LLM ms, tool ms) from the run log


async def _timed_runs(runtime: AgentRuntime, folder: str, runs: int) -> Runs:
    await runtime.start()
    measured = Runs()
    try:
        for _ in range(runs):
            start = time.perf_counter()
            outcome = await runtime.submit(
                AgentJob(folder=folder, prompt="how dry is the north field?", scheduled=True)
            )
            measured.seconds.append(time.perf_counter() - start)
            if outcome.status != "ok":
                raise SystemExit(f"run failed: {outcome.error}\n{outcome.log_path.read_text()[-3000:]}")
            measured.phases.append(outcome.phases_ms)
            timing = TIMING_RE.search(outcome.log_path.read_text())
            if timing:
                measured.runner.append((float(timing["llm"]), float(timing["tools"])))
    finally:
        await runtime.stop()
    return measured


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


def _command_row(data_dir: Path, llm: ScriptedLLM, runtime: str, code: str, runs: int) -> Runs:
    command = [sys.executable, "-c", f"{code}; {FLOOR}"]
    return asyncio.run(_timed_runs(_runtime(_settings(data_dir, runtime, llm), command=command), "field", runs))


def _measure(data_dir: Path, llm: ScriptedLLM, folders: list[str], runs: int, *, opencode: bool) -> Report:
    script = [ToolCall("memory_search", {"query": "north field"}), Reply("The north field is at 31 %.")]
    report = Report()
    floor = _command_row(data_dir, llm, "process", "pass", runs)
    report.rows.append(_row("python -c pass", floor.seconds, "interpreter only (the floor)"))
    imports = _command_row(data_dir, llm, "process", "import farmagent.run", runs)
    report.rows.append(_row("import farmagent.run", imports.seconds, "interpreter + the runner's imports"))
    bwrap = shutil.which("bwrap") is not None
    if not bwrap:
        print("bwrap: not installed (apt-get install bubblewrap)")
    else:
        sandboxed = _command_row(data_dir, llm, "bwrap", "pass", runs)
        report.rows.append(_row("python -c pass in bwrap", sandboxed.seconds, "interpreter in the sandbox"))
        report.runs["bwrap floor"] = sandboxed
    report.runs["floor"], report.runs["imports"] = floor, imports
    for name in ("process", "bwrap") if bwrap else ("process",):
        llm.script(*(script * runs))
        measured = asyncio.run(_timed_runs(_runtime(_settings(data_dir, name, llm)), "field", runs))
        answered = [r for r in llm.requests if "tomatoes" in (r.last_tool_result() or "")]
        if len(answered) < runs:
            raise SystemExit("memory_search did not reach the daemon")
        llm.requests.clear()
        report.runs[name] = measured
        report.rows.append(
            _row(name, measured.seconds, "farmagent runner, 2 LLM requests, 1 memory_search through the daemon")
        )
    if bwrap:
        runtime = _runtime(_settings(data_dir, "bwrap", llm, max_agents=2))
        times = asyncio.run(_parallel(runtime, folders, max(3, runs // 3)))
        report.rows.append(_row("bwrap, 4 groups at once", times, "wall time for all 4, FARMHOST_MAX_AGENTS=2"))
    if opencode and bwrap:
        llm.script(*([Reply("The north field is at 31 %.")] * runs))
        settings = _settings(data_dir, "bwrap", llm, kind="opencode")
        measured = asyncio.run(_timed_runs(_runtime(settings), "field", max(3, runs // 3)))
        llm.requests.clear()
        report.rows.append(_row("opencode in bwrap", measured.seconds, "OpenCode's own start, 1 streamed LLM answer"))
    return report


@dataclass
class Report:
    """The table's rows and the runs behind them (for the phase breakdown)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, Runs] = field(default_factory=dict)


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _phases(report: Report) -> list[tuple[str, float, str]]:
    """Where a run's time goes (bwrap where it ran), p50 of each part in ms, the total last."""
    sandboxed = "bwrap" in report.runs
    runs = report.runs["bwrap" if sandboxed else "process"]
    floor = report.runs["bwrap floor" if sandboxed else "floor"]
    host = {name: _p50([p.get(name, 0.0) for p in runs.phases]) for name in runs.phases[0]}
    started = _p50([p["agent"] for p in floor.phases])  # the interpreter, in the sandbox when there is one
    imports = (_p50(report.runs["imports"].seconds) - _p50(report.runs["floor"].seconds)) * 1000
    llm, tools = _p50([r[0] for r in runs.runner]), _p50([r[1] for r in runs.runner])
    inside = [
        ("interpreter start" + (" in bwrap" if sandboxed else ""), started, "python -c pass's agent phase"),
        ("runner imports", imports, "import farmagent.run minus python -c pass"),
        ("LLM requests through the proxy", llm, "2 requests: the runner's timing line"),
        ("tool call: memory_search through the daemon", tools, "1 call: the runner's timing line"),
    ]
    rest = host.get("agent", 0.0) - sum(ms for _, ms, _ in inside)
    return [
        ("snapshot hook (host)", host.get("hook", 0.0), "before_run; none in the bench"),
        ("memory search for the prompt (host)", host.get("memory", 0.0), "BM25 over the group's memory"),
        ("sandbox set-up (host)", host.get("sandbox", 0.0), "plan, mounts, cgroup"),
        *inside,
        ("rest of the agent process", rest, "AgentInput, prompt, conversation, exit; proxy start"),
        ("cleanup (host)", host.get("cleanup", 0.0), "cgroup, mounts"),
        ("run log (host)", host.get("log", 0.0), "written after the run"),
        ("total (submit to outcome)", _p50(runs.seconds) * 1000, ""),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15, help="runs per row (default 15)")
    parser.add_argument("--no-opencode", action="store_true", help="leave out the OpenCode row")
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
            opencode = (
                not args.no_opencode and opencode_binary(_settings(data_dir, "bwrap", llm).opencode_bin) is not None
            )
            report = _measure(data_dir, llm, folders, args.runs, opencode=opencode)
    print(f"\n| {'measure':<24} | {'n':>3} | {'p50 ms':>8} | {'p95 ms':>8} | note |")
    print(f"|{'-' * 26}|{'-' * 4}:|{'-' * 9}:|{'-' * 9}:|------|")
    for r in report.rows:
        print(f"| {r['name']:<24} | {r['n']:>3} | {r['p50']:>8.0f} | {r['p95']:>8.0f} | {r['note']} |")
    floor = next(r["p50"] for r in report.rows if r["name"] == "python -c pass")
    run = _p50(report.runs["bwrap" if "bwrap" in report.runs else "process"].seconds) * 1000
    verdict = "PASS" if run <= TARGET_MS else "FAIL"
    print(f"\nan agent run's own cost, p50: {run:.0f} ms (floor {floor:.0f} ms); target <= {TARGET_MS} ms: {verdict}")
    print(f"\n| {'where a run goes (p50)':<46} | {'ms':>6} | how |")
    print(f"|{'-' * 48}|{'-' * 7}:|-----|")
    for name, ms, how in _phases(report):
        print(f"| {name:<46} | {ms:>6.1f} | {how} |")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"\nlargest child process (an agent run, or bwrap around it): {peak:.0f} MB peak RSS")
    return 0


# The floor prints a valid AgentResult so the runtime treats it like any run.
FLOOR = (
    'import sys; sys.stdin.read(); print(\'{"status": "ok", "answer": "", "error": null, "turns": 0, "toolCalls": 0}\')'
)
TARGET_MS = 300  # issue 21: the benchmark's run (bwrap where it exists) at p50
TIMING_RE = re.compile(r"timing: \d+ LLM request\(s\) in (?P<llm>\d+) ms, \d+ tool call\(s\) in (?P<tools>\d+) ms")


if __name__ == "__main__":
    raise SystemExit(main())
