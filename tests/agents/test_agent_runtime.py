"""AgentRuntime with real processes: queueing per group, the global cap, limits, timeouts, output, logs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import init_data_dir_in_process, scaled, wait_for_async
from inotify_simple import INotify, flags
from runtime_support import add_group, make_runtime, probe_job, report, settings_for

from farmhost.agents.inputs import ELLIPSIS
from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.runlog import STALE_TEMP_SECONDS
from farmhost.agents.runtime import AgentRuntime
from farmhost.layout import DataLayout


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


async def started(runtime: AgentRuntime) -> AgentRuntime:
    await runtime.start()
    return runtime


def spans(outcomes: list[AgentOutcome]) -> list[tuple[float, float]]:
    return [(report(o)["started"], report(o)["ended"]) for o in outcomes]


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


async def test_a_run_gets_the_contract_input_and_returns_the_answer(root: Path) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        job = AgentJob(folder="main", prompt="{}", scheduled=True, task_id="t-1", context_mode="group")
        outcome = await runtime.submit(job)
    finally:
        await runtime.stop()
    seen = report(outcome)["input"]
    assert seen == {
        "version": 1,
        "runId": job.run_id,
        "groupFolder": "main",
        "isMain": True,
        "prompt": "{}",
        "scheduled": True,
        "taskId": "t-1",
        "contextMode": "group",
        "timezone": "Europe/Lisbon",
        "now": seen["now"],
        "chatJid": None,
        "memory": [],
        "maxTurns": 12,
        "model": "",
    }
    assert seen["now"].endswith("Z")
    assert outcome.exit_code == 0 and outcome.error is None
    assert outcome.log_path == root / "logs" / "runs" / "main" / f"run-{job.run_id}.log"


async def test_two_jobs_of_one_group_never_overlap(root: Path) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process", FARMHOST_MAX_AGENTS=4)))
    try:
        outcomes = await asyncio.gather(*(runtime.submit(probe_job("field", sleep=0.2)) for _ in range(3)))
    finally:
        await runtime.stop()
    assert most_at_once(spans(list(outcomes))) == 1


async def test_the_global_cap_holds_across_groups(root: Path) -> None:
    add_group(root, "barn", "telegram:300")
    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="process", FARMHOST_MAX_AGENTS=2)
    runtime = await started(make_runtime(settings))
    peak = 0

    async def watch() -> None:  # the host's own count of the processes it runs, looked at every 5 ms
        nonlocal peak
        while True:
            peak = max(peak, len(runtime.running))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        jobs = [probe_job(folder, sleep=0.3) for folder in ("main", "field", "barn") for _ in range(2)]
        outcomes = await asyncio.gather(*(runtime.submit(job) for job in jobs))
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await runtime.stop()
    # Two at once, by the host's count: it counts a run from its process's start to its end (the interpreter's
    # start and the 0.3 s sleep). The probes' own clocks showed it only when two interpreters started within 0.3 s
    # of each other, which a loaded machine does not promise (0.27 s apart seen at load 13); they still show that
    # never three ran.
    assert peak == 2
    intervals = spans(list(outcomes))
    assert most_at_once(intervals) <= 2
    for folder in ("main", "field", "barn"):
        own = [i for i, job in zip(intervals, jobs, strict=True) if job.folder == folder]
        assert most_at_once(own) == 1


async def test_scheduled_jobs_go_before_queued_chat_jobs(root: Path) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        first = asyncio.create_task(runtime.submit(probe_job("field", sleep=0.5)))
        await wait_for_async(lambda: runtime.running, what="the first run to start")
        chat1 = asyncio.create_task(runtime.submit(probe_job("field")))
        chat2 = asyncio.create_task(runtime.submit(probe_job("field")))
        scheduled = asyncio.create_task(runtime.submit(probe_job("field", scheduled=True)))
        await wait_for_async(lambda: runtime.queued("field") == 3, what="the three jobs to queue behind the first")
        outcomes = await asyncio.gather(first, chat1, chat2, scheduled)
    finally:
        await runtime.stop()
    order = sorted(range(4), key=lambda i: report(outcomes[i])["started"])
    assert order == [0, 3, 1, 2]


# The run's time limit in the two timeout tests: time for a loaded machine to start the probe and let it install its
# SIGTERM handling (ignore it, or note it and exit 7) before the timeout sends SIGTERM.
PROBE_TIMEOUT = 4.0


@pytest.mark.parametrize("runtime_name", ["process", "bwrap"])
async def test_a_run_over_its_time_is_killed_even_when_it_ignores_sigterm(root: Path, runtime_name: str) -> None:
    limits = {"groups": {"field": {"timeoutSeconds": PROBE_TIMEOUT}}}
    (root / "agent-limits.json").write_text(json.dumps(limits))
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME=runtime_name), term_grace=1.0))
    try:
        began = time.monotonic()
        outcome = await runtime.submit(probe_job("field", ignore_term=True, sleep=30))
        took = time.monotonic() - began
    finally:
        await runtime.stop()
    assert outcome.status == "timeout"
    assert outcome.error == f"the run took longer than {PROBE_TIMEOUT:g} s and was stopped"
    # SIGKILL: SIGTERM was ignored. -9 when the kill reached bwrap itself first; 128 + 9 when bwrap saw its
    # sandboxed child killed and exited first, reporting it (both happen, by the order the kernel takes them)
    assert outcome.exit_code in (-9, 128 + 9), outcome.exit_code
    assert took >= PROBE_TIMEOUT + 1.0  # the timeout, then the whole grace (SIGTERM was ignored)
    assert took < PROBE_TIMEOUT + 1.0 + scaled(3)  # ... and then no more than it takes to kill and reap it
    assert "status: timeout" in outcome.log_path.read_text()


@pytest.mark.parametrize("runtime_name", ["process", "bwrap"])
async def test_sigterm_reaches_the_agent_first(root: Path, runtime_name: str) -> None:
    (root / "agent-limits.json").write_text(json.dumps({"default": {"timeoutSeconds": PROBE_TIMEOUT}}))
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME=runtime_name), term_grace=5))
    try:
        began = time.monotonic()
        outcome = await runtime.submit(probe_job("field", note_term=True, sleep=30))
        took = time.monotonic() - began
    finally:
        await runtime.stop()
    assert outcome.status == "timeout"
    assert outcome.exit_code == 7  # the probe's own exit on SIGTERM, not the SIGKILL at the end of the grace
    assert took < PROBE_TIMEOUT + 5  # the 5 s grace was not waited out
    assert "probe got SIGTERM" in outcome.log_path.read_text()


async def test_output_is_capped_and_the_run_still_ends(root: Path) -> None:
    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="process", FARMHOST_AGENT_OUTPUT_BYTES=65536)
    runtime = await started(make_runtime(settings))
    try:
        outcome = await runtime.submit(probe_job("field", spam_bytes=10 * 1024 * 1024))
    finally:
        await runtime.stop()
    assert report(outcome)["input"]["groupFolder"] == "field"  # the result line at the end survived the cap
    text = outcome.log_path.read_text()
    assert outcome.log_path.stat().st_size < 4 * 65536
    assert text.count("bytes dropped: over the output limit") == 2  # stdout and stderr


@pytest.mark.parametrize(
    ("todo", "error"),
    [
        ({"print": "this is not JSON"}, "agent printed no result (its last output line is not JSON) (exit code 0)"),
        ({"print": "", "exit": 3}, "agent printed no result (exit code 3)"),
        ({"print": "[1, 2]"}, "agent printed no result (its last output line is not a JSON object) (exit code 0)"),
        (
            {"print": '{"status": "maybe"}'},
            (
                "agent printed no result (its last output line is not a valid result: status: Input should be 'ok' "
                "or 'error') (exit code 0)"
            ),
        ),
        ({"print": '{"status": "error"}', "exit": 1}, "the agent reported an error without saying why (exit code 1)"),
        ({"print": '{"status": "error", "error": "the pump is gone"}'}, "the pump is gone"),
    ],
)
async def test_bad_or_failed_output_gives_a_clear_error(root: Path, todo: dict[str, Any], error: str) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        outcome = await runtime.submit(probe_job("field", stderr=["traceback of the probe"], **todo))
    finally:
        await runtime.stop()
    assert outcome.status == "error"
    assert outcome.error is not None and outcome.error.startswith(error)
    assert "traceback of the probe" in outcome.log_path.read_text()  # the stderr tail is in the log


async def test_the_run_log_tells_what_ran_and_how_it_ended(root: Path) -> None:
    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="process", HA_TOKEN="ha-secret-token-123")
    runtime = await started(make_runtime(settings))
    try:
        job = AgentJob(folder="field", prompt=json.dumps({"stderr": ["note on stderr"]}), scheduled=False,
                       chat_jid="telegram:200")  # fmt: skip
        outcome = await runtime.submit(job)
    finally:
        await runtime.stop()
    text = outcome.log_path.read_text()
    assert text.startswith(f"run {job.run_id} of group field\n")
    for part in (
        "job: chat telegram:200, context isolated",
        "limits: 600 s, 1024 MB, 256 processes, 12 turns",
        "runtime: process",
        "command: ",
        "status: ok, exit code 0",
        "agent: 1 turn(s), 0 tool call(s)",
        "--- prompt ---",
        "--- stdout ---",
        '"status": "ok"',
        "--- stderr ---",
        "note on stderr",
    ):
        assert part in text, part
    assert "ha-secret-token-123" not in text


async def test_a_run_log_appears_whole_under_its_name(root: Path) -> None:
    """Whoever waits for `run-<id>.log` (an operator's `tail`, a test) never opens it empty or half written."""
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    logs = DataLayout(root).run_logs("field")
    logs.mkdir(parents=True, exist_ok=True)
    with INotify() as watch:
        watch.add_watch(logs, flags.CREATE | flags.MODIFY | flags.CLOSE_WRITE | flags.MOVED_TO)
        try:
            outcome = await runtime.submit(AgentJob(folder="field", prompt="{}", scheduled=False))
        finally:
            await runtime.stop()
        seen = [(event.name, [flag.name for flag in flags.from_mask(event.mask)]) for event in watch.read(timeout=0)]
    assert [flagged for name, flagged in seen if name == outcome.log_path.name] == [["MOVED_TO"]], seen
    assert "status: ok, exit code 0" in outcome.log_path.read_text()
    assert sorted(path.name for path in logs.iterdir()) == [outcome.log_path.name]


async def test_a_log_left_half_written_by_a_killed_daemon_goes_at_the_next_run(root: Path) -> None:
    """The temp file of a log whose writer died (kill -9) goes once it is old; a fresh one (a writer now) stays."""
    logs = DataLayout(root).run_logs("field")
    logs.mkdir(parents=True, exist_ok=True)
    dead, writing = logs / ".run-20260101T000000-dead.log.0badc0de.tmp", logs / ".run-now.log.0000beef.tmp"
    for path in (dead, writing):
        path.write_text("run 20260101T000000-dead of group field\n")
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(dead, (old, old))
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        outcome = await runtime.submit(AgentJob(folder="field", prompt="{}", scheduled=False))
    finally:
        await runtime.stop()
    assert sorted(path.name for path in logs.iterdir()) == sorted([writing.name, outcome.log_path.name])


async def test_the_before_run_hook_runs_before_each_run(root: Path) -> None:
    calls: list[tuple[str, float]] = []

    async def hook(folder: str) -> None:
        calls.append((folder, time.time()))

    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process"), before_run=hook))
    try:
        first = await runtime.submit(probe_job("field"))
        second = await runtime.submit(probe_job("main"))
    finally:
        await runtime.stop()
    assert [folder for folder, _ in calls] == ["field", "main"]
    assert calls[0][1] <= report(first)["started"] <= calls[1][1] <= report(second)["started"]


async def test_a_failing_hook_or_memory_search_does_not_stop_the_run(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def hook(folder: str) -> None:
        raise OSError("disk full")

    async def memory(folder: str, prompt: str) -> list[dict[str, Any]]:
        raise RuntimeError("index broken")

    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="process")
    runtime = await started(make_runtime(settings, before_run=hook, memory_snippets=memory))
    try:
        outcome = await runtime.submit(probe_job("field"))
    finally:
        await runtime.stop()
    assert report(outcome)["input"]["memory"] == []
    assert "the pre-run hook failed" in caplog.text and "running without memory" in caplog.text


async def test_memory_snippets_are_trimmed_to_the_budget(root: Path) -> None:
    queries: list[tuple[str, str]] = []

    async def memory(folder: str, prompt: str) -> list[dict[str, Any]]:
        queries.append((folder, prompt))
        return [
            {"source": "memory", "citation": "MEMORY.md#L1-L4", "groupFolder": folder, "snippet": "pump A " * 20},
            {"source": "memory", "citation": "global:MEMORY.md#L9", "groupFolder": "global", "snippet": "valve " * 40},
            {"source": "session", "groupFolder": folder, "chatJid": "telegram:200", "sender": "Ana",
             "timestamp": "2026-05-17T00:00:00.000Z", "snippet": "never reached"},
        ]  # fmt: skip

    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="process", FARMHOST_MEMORY_PROMPT_CHARS=300)
    runtime = await started(make_runtime(settings, memory_snippets=memory))
    try:
        job = probe_job("field")
        outcome = await runtime.submit(job)
    finally:
        await runtime.stop()
    assert queries == [("field", job.prompt)]
    memory_in = report(outcome)["input"]["memory"]
    assert [m["citation"] for m in memory_in] == ["MEMORY.md#L1-L4", "global:MEMORY.md#L9"]
    assert memory_in[0]["snippet"] == ("pump A " * 20).strip()
    assert memory_in[1]["snippet"].endswith(ELLIPSIS) and memory_in[1]["groupFolder"] == "global"
    assert sum(len(m["citation"]) + len(m["snippet"]) for m in memory_in) <= 300


async def test_group_limits_from_the_file_apply(root: Path) -> None:
    limits = {"default": {"maxTurns": 5}, "groups": {"field": {"memoryMb": 256, "maxTurns": 3}}}
    (root / "agent-limits.json").write_text(json.dumps(limits))
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        field = report(await runtime.submit(probe_job("field", alloc_mb=400)))
        main = report(await runtime.submit(probe_job("main", alloc_mb=400)))
    finally:
        await runtime.stop()
    assert field["input"]["maxTurns"] == 3 and main["input"]["maxTurns"] == 5
    assert field["rlimits"]["RLIMIT_AS"] == 256 * 1024 * 1024
    assert field["alloc"] == "MemoryError"
    assert main["rlimits"]["RLIMIT_AS"] == 1024 * 1024 * 1024 and main["alloc"] == "ok"
    assert field["rlimits"]["RLIMIT_NPROC"] == 256 and field["rlimits"]["RLIMIT_CORE"] == 0
    assert field["rlimits"]["RLIMIT_NOFILE"] == 1024, "the daemon raised its own descriptor limit, not the agent's"


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ({"groups": {"field": {"maxTurn": 3}}}, "groups.field.maxTurn: Extra inputs are not permitted"),
        ({"default": {"memoryMb": 1}}, "default.memoryMb: Input should be greater than or equal to 64"),
        ({"defaults": {}}, "defaults: Extra inputs are not permitted"),
        (
            {"groups": {"field": {"agentKind": "command"}}},
            "groups.field: Value error, agentKind command needs agentCommand",
        ),
        (
            {"groups": {"field": {"agentKind": "claude"}}},
            "groups.field.agentKind: Input should be 'farmagent', 'opencode' or 'command'",
        ),
        ("{not json", "not valid JSON"),
    ],
)
async def test_a_broken_limits_file_is_reported_and_the_defaults_apply(
    root: Path, caplog: pytest.LogCaptureFixture, content: object, named: str
) -> None:
    path = root / "agent-limits.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    try:
        with caplog.at_level(logging.ERROR):
            first = report(await runtime.submit(probe_job("field")))
            report(await runtime.submit(probe_job("field")))
    finally:
        await runtime.stop()
    assert first["input"]["maxTurns"] == 12
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # reported once, not at every run
    assert str(path) in errors[0] and named in errors[0]


async def test_stop_cancels_queued_jobs_and_ends_running_ones(root: Path) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="process")))
    running = asyncio.create_task(runtime.submit(probe_job("field", ignore_term=True, sleep=30)))
    await wait_for_async(lambda: runtime.running, what="the first run to start")
    queued = asyncio.create_task(runtime.submit(probe_job("field")))
    await wait_for_async(lambda: runtime.queued("field") == 1, what="the second job to queue")
    began = time.monotonic()
    await runtime.stop()
    assert time.monotonic() - began < scaled(5)
    ended, waiting = await asyncio.gather(running, queued)
    assert ended.status == "cancelled" and ended.error == "the agent runtime stopped while the run was going on"
    assert waiting.status == "cancelled" and waiting.error == "the agent runtime stopped before the run started"
    after = await runtime.submit(probe_job("field"))
    assert after.status == "cancelled" and after.error == "the agent runtime is not running"


async def test_an_unknown_group_or_a_missing_runtime_is_a_clear_error(root: Path) -> None:
    missing_python = root / "no-such-python"
    settings = settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=str(missing_python))
    runtime = await started(make_runtime(settings))
    try:
        unknown = await runtime.submit(probe_job("nobody"))
        missing = await runtime.submit(probe_job("field"))
    finally:
        await runtime.stop()
    assert unknown.status == "error" and unknown.error == "group 'nobody' is not registered"
    assert missing.status == "error" and missing.error is not None
    assert missing.error.startswith(f"agent runs are off: cannot run the agent interpreter {missing_python}")
    assert "FARMHOST_AGENT_PYTHON" in missing.error


async def test_the_built_in_runner_without_an_llm_is_refused_before_any_sandbox_starts(root: Path) -> None:
    runtime = await started(make_runtime(settings_for(root, FARMHOST_AGENT_RUNTIME="bwrap"), command=None))
    try:
        outcome = await runtime.submit(AgentJob(folder="field", prompt="how dry is field 2?", scheduled=True))
    finally:
        await runtime.stop()
    assert outcome.status == "error" and outcome.exit_code is None
    assert (
        outcome.error is not None and "FARMHOST_LLM_BASE_URL" in outcome.error and "FARMHOST_LLM_MODEL" in outcome.error
    )
    assert not outcome.log_path.exists()  # nothing was launched, so there is no run to log
