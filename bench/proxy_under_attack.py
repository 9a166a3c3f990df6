"""The daemon's memory and event-loop lag while an agent sends its LLM proxy bodies that grow when built.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/proxy_under_attack.py               # both scenarios, about 30 s
    .venv/bin/python bench/proxy_under_attack.py --bodies 16   # more at once (the run's connection cap follows)
    .venv/bin/python bench/proxy_under_attack.py --json out.json

Each scenario gets a fresh data dir and a fresh ``python -m farmhost run`` with bubblewrap and a scripted LLM
upstream; group ``field``'s agent is the program of ``farmhost_dev/proxy_attack.py`` (kind ``command``), so the
bodies come from inside its sandbox:

- ``baseline``: ``--bodies`` ordinary chat requests (a few KB each) at once, forwarded upstream;
- ``attack``: ``--bodies`` 4 MiB bodies of empty objects at once (issue 33, finding 3), then one nested a million
  levels deep.

Reported: the daemon's RSS before the run and its peak (``VmHWM``), and the event loop's worst wake-up lag over the
window (``logs/loop_lag.json``, the loop's longest turn: the worst per-document maximum). Targets: at most
+100 MB and no stall over 50 ms. It reports and never gates: exit 0 whatever the figures, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

from roundtrip_machine import file_costs, machine_info
from roundtrip_report import add_output_options, busy_note, log, machine_lines, report_run

from farmhost_dev.llm_stub import Reply, ScriptedLLM
from farmhost_dev.proxy_attack import REPORT, agent_command, status_kb
from farmhost_dev.testing import Daemon, clean_env, drop, init_data_dir_in_process, wait_result

TARGET_RSS_GROWTH_MB = 100.0
TARGET_LAG_MAX_MS = 50.0
ZONE = "UTC"
RUN_TIMEOUT_S = 180.0  # the old daemon took minutes over the attack; a scenario not done by then is reported so


@dataclass(kw_only=True)
class Row:
    """One scenario's figures."""

    scenario: str
    bodies: int
    body_kb: float = 0.0
    answers: dict[str, int] = field(default_factory=dict)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    lag_max_ms: float = 0.0
    seconds: float = 0.0
    finished: bool = False


@dataclass(kw_only=True)
class Report:
    """The rows and the machine they ran on."""

    date: str
    rows: list[Row]
    machine: dict[str, Any]
    wall_seconds: float


def _lag(data_dir: Path) -> dict[str, Any] | None:
    try:
        document: dict[str, Any] = json.loads((data_dir / "logs" / "loop_lag.json").read_bytes())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return document


def _fresh_lag(data_dir: Path, after: float) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        document = _lag(data_dir)
        if document is not None and document["updatedAt"] > after:
            return document
        time.sleep(0.05)
    raise RuntimeError("the daemon wrote no logs/loop_lag.json for 30 s")


def _scenario(base: Path, mode: Literal["tiny", "normal"], bodies: int) -> Row:
    row = Row(scenario="attack" if mode == "tiny" else "baseline", bodies=bodies)
    data_dir = init_data_dir_in_process(base / row.scenario)
    limits = {"groups": {"field": {"agentKind": "command", "agentCommand": agent_command(mode, bodies)}}}
    (data_dir / "agent-limits.json").write_text(json.dumps(limits))
    with ScriptedLLM(then=Reply("done")) as llm:
        env = clean_env(
            TZ=ZONE,
            FARMHOST_AGENT_RUNTIME="bwrap",
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_MODEL="farm-model",
            FARMHOST_LLM_RUN_CONNECTIONS=str(max(8, bodies)),
        )
        daemon = Daemon(data_dir, env=env).start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        try:
            first = _fresh_lag(data_dir, time.time())
            row.rss_before_mb = status_kb(pid, "VmRSS") / 1024
            seen: dict[float, float] = {}
            stop = threading.Event()

            def follow() -> None:
                while not stop.wait(0.2):
                    document = _lag(data_dir)
                    if document is not None and document["updatedAt"] > first["updatedAt"]:
                        seen[document["updatedAt"]] = document["intervalMaxMs"]

            watcher = threading.Thread(target=follow, daemon=True)
            watcher.start()
            started = time.monotonic()
            due = datetime.now(ZoneInfo(ZONE)).replace(microsecond=0) + timedelta(seconds=1)
            task = {"type": "schedule_task", "prompt": "send", "schedule_type": "once"}
            wait_result(
                data_dir,
                "field",
                drop(data_dir, "field", "tasks", {**task, "schedule_value": f"{due:%Y-%m-%dT%H:%M:%S}"}),
            )
            report = data_dir / "groups" / "field" / REPORT
            while not report.exists() and time.monotonic() - started < RUN_TIMEOUT_S:
                time.sleep(0.1)
            row.seconds = round(time.monotonic() - started, 1)
            row.finished = report.exists()
            last = _fresh_lag(data_dir, time.time())
            stop.set()
            watcher.join()
            seen[last["updatedAt"]] = last["intervalMaxMs"]
            row.lag_max_ms = max(seen.values())
            row.rss_peak_mb = status_kb(pid, "VmHWM") / 1024
        finally:
            daemon.stop(timeout=30)
    if row.finished:
        attack = json.loads(report.read_text())
        row.body_kb = round(attack["bodyBytes"] / 1024, 1)
        row.answers = dict(Counter(f"{status} {message[:48]}".strip() for status, message in attack["answers"]))
    return row


def _measure(args: argparse.Namespace) -> Report:
    if shutil.which("bwrap") is None:
        raise RuntimeError("bwrap is not installed: the agent runs in bubblewrap")
    began = time.monotonic()
    machine = machine_info(args.dir)
    base = Path(tempfile.mkdtemp(prefix="farmhost-proxy-bench-", dir=args.dir))
    try:
        rows = []
        for mode in ("normal", "tiny"):
            log(f"scenario {'attack' if mode == 'tiny' else 'baseline'}: {args.bodies} bodies at once")
            rows.append(_scenario(base, mode, args.bodies))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    machine["loadavg_at_end"] = os.getloadavg()[0]
    machine["at_end"] = file_costs(args.dir)
    return Report(
        date=time.strftime("%Y-%m-%d %H:%M"), rows=rows, machine=machine, wall_seconds=round(time.monotonic() - began)
    )


def _render(report: Report) -> str:
    head = f"{'scenario':<10} {'bodies':>6} {'body KB':>8} {'RSS MB':>7} {'peak MB':>8} {'growth':>7}"
    lines = [f"{head} {'lag max ms':>10} {'seconds':>8}  answers"]
    for row in report.rows:
        growth = row.rss_peak_mb - row.rss_before_mb
        met = growth <= TARGET_RSS_GROWTH_MB and row.lag_max_ms <= TARGET_LAG_MAX_MS and row.finished
        answers = "; ".join(f"{n} x {what}" for what, n in row.answers.items()) or "(the agent did not finish)"
        lines.append(
            f"{row.scenario:<10} {row.bodies:>6} {row.body_kb:>8.0f} {row.rss_before_mb:>7.0f} {row.rss_peak_mb:>8.0f}"
            f" {growth:>+7.0f} {row.lag_max_ms:>10.1f} {row.seconds:>8.1f}  {answers}{'' if met else '  (over target)'}"
        )
    lines.append(
        f"targets: at most +{TARGET_RSS_GROWTH_MB:g} MB RSS, no event-loop stall over {TARGET_LAG_MAX_MS:g} ms"
    )
    lines += machine_lines(report.date, report.machine, report.wall_seconds) + busy_note(report.machine)
    return "\n".join(lines)


def main() -> int:
    """Parse the command line, run both scenarios, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=int, default=8, help="bodies the agent sends at once (default 8)")
    add_output_options(parser)
    args = parser.parse_args()
    return report_run("proxy_under_attack", lambda: _measure(args), _render, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
