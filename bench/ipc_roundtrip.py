"""IPC round-trip benchmark: an agent-like client against the real `farmhost run` daemon and polling baselines.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/ipc_roundtrip.py            # full run, under ~3 minutes
    .venv/bin/python bench/ipc_roundtrip.py --quick    # ~35 s smoke run, fewer samples
    .venv/bin/python bench/ipc_roundtrip.py --json out.json

Every host is measured in the same run, on fresh temporary data directories, with the same client:

- ``farmhost``: ``python -m farmhost run`` (inotify mode, the default), groups added with ``farmhost group add``;
- ``farmhost poll``: the same daemon with ``FARMHOST_IPC_MODE=poll`` (``FARMHOST_IPC_POLL_SECONDS``, default 0.5);
- ``poll 1s`` / ``poll 0.5s``: a minimal host loop in this script that lists every ``actions/`` directory every
  N seconds, reads and deletes each request and writes its result (dot-temp + rename), as the TypeScript
  systems farmhost replaces do;
- ``raw floor``: a minimal inotify host in this script (no validation, no ledger, result fsync'd like
  farmhost's): the cost of the file round trip itself on this machine.

The client writes each request the way an agent does (``O_EXCL`` temp name starting with '.', then rename to
``<requestId>.json`` in ``ipc/<folder>/actions/``) and waits for ``action_results/<requestId>.json`` with
inotify on the results directory, falling back to a directory check when no event came for 100 ms.
The script reports; it never gates: the exit status is 0 whatever the figures (2 on a setup failure).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from roundtrip_client import POLL_FALLBACK_MS, WINDOW, Latency, Throughput, sequential, throughput
from roundtrip_hosts import (
    FarmhostDaemon,
    Host,
    HostMain,
    ScriptHost,
    inotify_host_main,
    make_data_dir,
    poll_host_main,
    rss_mb,
    task_schedstat,
)
from roundtrip_machine import file_costs, machine_info
from roundtrip_report import add_output_options, busy_note, log, machine_lines, report_run

# The targets; they apply to the `farmhost` (inotify) column only. Issue 36: the quiet path is judged against the
# raw floor measured in the same run (a ratio holds on a loaded machine where an absolute figure does not).
TARGET_P50_X_FLOOR = 1.3  # ping p50 at most this many times the floor's
TARGET_P99_MS = 10.0
TARGET_RPS_8_OF_FLOOR = 0.70  # 8-group rate at least this share of the floor's
TARGET_CPU_PER_REQ_X_FLOOR = 2.5  # host CPU per request under the 8-group load, at most this many times the floor's
TARGET_IDLE_CPU_PCT = 0.5  # issue 36 (it was 1.0)
TARGET_IDLE_WAKEUPS = 20.0  # per second, every thread of the daemon (issue 36)
TARGET_IDLE_RSS_MB = 100.0

# Between sequential requests: an idle host gets time to go back to sleep, as between an agent's tool calls
# (the same 3 ms the reference floor measurement used).
SEQUENTIAL_GAP_S = 0.003
FLOOR = "raw floor"


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class Plan:
    """How many samples and seconds each measurement gets."""

    fast_n: int  # sequential pings against farmhost (inotify)
    floor_n: int  # ... against the raw floor host (only a reference: fewer)
    fast_warmup: int
    slow_n: int  # ... against the polling hosts (each costs about one poll interval)
    fast_load_seconds: float  # the counted window of a throughput run against an inotify host
    slow_load_seconds: float  # ... against a polling host (its rate is window x groups / interval anyway)
    ramp_seconds: float  # load before the counted window starts
    idle_seconds: float
    settle_seconds: float  # after the idle hosts started, before counting


FULL = Plan(
    fast_n=2000,
    floor_n=1000,
    fast_warmup=200,
    slow_n=20,
    fast_load_seconds=5.0,
    slow_load_seconds=4.0,
    ramp_seconds=0.5,
    idle_seconds=20.0,
    settle_seconds=2.0,
)
QUICK = Plan(
    fast_n=300,
    floor_n=300,
    fast_warmup=50,
    slow_n=3,
    fast_load_seconds=1.0,
    slow_load_seconds=1.0,
    ramp_seconds=0.3,
    idle_seconds=3.0,
    settle_seconds=1.0,
)


@dataclass
class Column:
    """Everything measured for one host."""

    name: str
    description: str
    latency: Latency | None = None
    processing_p50_ms: float | None = None  # farmhost's own durationMs (requests.ndjson) in the latency run
    load_1: Throughput | None = None
    load_8: Throughput | None = None
    idle_cpu_pct: float | None = None
    idle_wakeups_per_s: float | None = None  # timeslices of all its threads: how often it was woken to run
    idle_rss_mb: float | None = None


@dataclass
class Report:
    """The whole run, as `--json` dumps it."""

    date: str
    machine: dict[str, Any]
    options: dict[str, Any]
    columns: list[Column]
    verdicts: dict[str, bool]
    wall_seconds: float = 0.0
    floor_ratios: dict[str, float | None] = field(default_factory=dict)  # farmhost over the raw floor, this run


@contextlib.contextmanager
def running(host: Host) -> Iterator[Host]:
    """Stop the host whatever happens."""
    try:
        yield host
    finally:
        host.stop()


def measure_host(column: Column, start: Callable[[int], Host], plan: Plan, *, poll_interval: float | None,
                 fsync: bool) -> None:  # fmt: skip
    """Latency with 1 group, then throughput with 1 and 8 groups (a fresh host for each group count)."""
    if poll_interval is None:
        n = plan.floor_n if column.name == FLOOR else plan.fast_n
        warmup, seconds = plan.fast_warmup, plan.fast_load_seconds

        def gap() -> float:
            return SEQUENTIAL_GAP_S
    else:
        # Arrivals at a random phase of the poll cycle, as an agent's are; back-to-back requests would lock
        # onto the cycle and always wait a full interval.
        n, warmup, seconds, interval = plan.slow_n, 0, plan.slow_load_seconds, poll_interval

        def gap() -> float:
            return random.uniform(0, interval)

    with running(start(1)) as host:
        log(f"{column.name}: {n} sequential pings (+{warmup} warm-up), 1 group")
        column.latency = sequential(host.group_dir(0), n=n, warmup=warmup, gap=gap, fsync=fsync)
        if isinstance(host, FarmhostDaemon):
            column.processing_p50_ms = statistics.median(host.processing_ms(n))
        log(f"{column.name}: window {WINDOW}, {seconds:g} s, 1 group")
        column.load_1 = throughput(host, groups=1, seconds=seconds, ramp=plan.ramp_seconds, fsync=fsync)
    with running(start(8)) as host:
        log(f"{column.name}: window {WINDOW} per group, {seconds:g} s, 8 groups")
        column.load_8 = throughput(host, groups=8, seconds=seconds, ramp=plan.ramp_seconds, fsync=fsync)


def measure_idle(hosts: dict[str, Host], plan: Plan) -> dict[str, tuple[float, float, float]]:
    """CPU % of one core, wake-ups a second and VmRSS of idle hosts, measured side by side.

    Both from `/proc/<pid>/task/*/schedstat` (ns on a CPU and timeslices): finer than `/proc/<pid>/stat`'s clock
    ticks, which an idle daemon's 0.1 s of CPU over 20 s would round to a few ticks.
    """
    time.sleep(plan.settle_seconds)
    before = {name: task_schedstat(host.pid) for name, host in hosts.items()}
    started = time.perf_counter()
    time.sleep(plan.idle_seconds)
    elapsed = time.perf_counter() - started
    figures: dict[str, tuple[float, float, float]] = {}
    for name, host in hosts.items():
        (cpu_ns, slices), (cpu_ns_0, slices_0) = task_schedstat(host.pid), before[name]
        figures[name] = ((cpu_ns - cpu_ns_0) / elapsed / 1e7, (slices - slices_0) / elapsed, rss_mb(host.pid))
    return figures


def run(plan: Plan, *, bench_dir: Path, fsync: bool, idle_only: bool = False) -> Report:
    """Build the data dirs, measure every host (or only the idle row), and return the report."""
    wall = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="farmhost-bench-", dir=bench_dir))
    report = Report(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=machine_info(root),
        options={"plan": asdict(plan), "window": WINDOW, "client_fsync": fsync, "gap_ms": SEQUENTIAL_GAP_S * 1000},
        columns=[],
        verdicts={},
    )
    try:
        log(f"creating data dirs with `farmhost group add` under {root}")
        dirs = {1: make_data_dir(root / "fh1", 1)}
        dirs[8] = make_data_dir(root / "fh8", 8, template=dirs[1])
        fresh_count = 0

        def fresh(groups: int) -> Path:  # a pristine copy per daemon start: no ledger rows from earlier runs
            nonlocal fresh_count
            fresh_count += 1
            target = root / f"run{fresh_count:02d}"
            target.mkdir()
            shutil.copytree(dirs[groups], target / "data", symlinks=True)
            return target / "data"

        farmhost = Column("farmhost", "farmhost run, inotify (default)")
        fh_poll = Column("farmhost poll", "farmhost run, FARMHOST_IPC_MODE=poll, 0.5 s")
        poll_1 = Column("poll 1s", "script host listing actions/ every 1 s")
        poll_05 = Column("poll 0.5s", "script host listing actions/ every 0.5 s")
        floor = Column(FLOOR, "script host on inotify, no validation/ledger")
        report.columns = [farmhost, fh_poll, poll_1, poll_05, floor]

        def script_host(main: HostMain, interval: float) -> Callable[[int], Host]:
            def start(groups: int) -> Host:
                nonlocal fresh_count
                fresh_count += 1
                return ScriptHost(root / f"run{fresh_count:02d}", groups, main, interval)

            return start

        if idle_only:
            dirs[16] = make_data_dir(root / "fh16", 16, template=dirs[8])
        else:
            measure_host(farmhost, lambda g: FarmhostDaemon(fresh(g)), plan, poll_interval=None, fsync=fsync)
            measure_host(floor, script_host(inotify_host_main, 0), plan, poll_interval=None, fsync=fsync)
            measure_host(
                fh_poll, lambda g: FarmhostDaemon(fresh(g), mode="poll", poll_seconds=0.5), plan, poll_interval=0.5,
                fsync=fsync,
            )  # fmt: skip
            # The 16-group dir is built while the script pollers run: their figures are poll intervals, which a few
            # `farmhost group add` processes on the other core do not move; it saves the run ~5 s.
            with ThreadPoolExecutor(max_workers=1) as pool:
                dir_16 = pool.submit(make_data_dir, root / "fh16", 16, template=dirs[8])
                measure_host(poll_1, script_host(poll_host_main, 1.0), plan, poll_interval=1.0, fsync=fsync)
                measure_host(poll_05, script_host(poll_host_main, 0.5), plan, poll_interval=0.5, fsync=fsync)
                dirs[16] = dir_16.result()
        log(f"idle with 16 groups: settle {plan.settle_seconds:g} s, then {plan.idle_seconds:g} s of /proc deltas")
        idle_hosts: dict[str, Host] = {}
        try:
            idle_hosts[farmhost.name] = FarmhostDaemon(fresh(16))
            idle_hosts[fh_poll.name] = FarmhostDaemon(fresh(16), mode="poll", poll_seconds=0.5)
            idle_hosts[poll_1.name] = script_host(poll_host_main, 1.0)(16)
            idle_hosts[poll_05.name] = script_host(poll_host_main, 0.5)(16)
            idle = measure_idle(idle_hosts, plan)
        finally:
            for host in idle_hosts.values():
                host.stop()
        for column in report.columns:
            if column.name in idle:
                column.idle_cpu_pct, column.idle_wakeups_per_s, column.idle_rss_mb = idle[column.name]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.verdicts = verdicts(farmhost, floor)
    report.floor_ratios = ratios(farmhost, floor)
    report.machine["loadavg_at_end"] = os.getloadavg()[0]
    report.machine["at_end"] = file_costs(bench_dir)  # the disk may have changed under a long run
    report.wall_seconds = round(time.perf_counter() - wall, 1)
    return report


def cpu_per_request_ms(load: Throughput | None) -> float | None:
    """Host CPU per request under a load (ms): its share of a core over its rate."""
    if load is None or not load.requests_per_s:
        return None
    return load.host_cpu_pct * 10 / load.requests_per_s


def ratios(column: Column, floor: Column) -> dict[str, float | None]:
    """The issue-36 figures of `column` as ratios to the raw floor of the same run (None when either is missing)."""

    def ratio(mine: float | None, theirs: float | None) -> float | None:
        return None if mine is None or not theirs else mine / theirs

    lat, flat = column.latency, floor.latency
    return {
        "p50_x_floor": ratio(lat.p50_ms if lat else None, flat.p50_ms if flat else None),
        "rps_8_of_floor": ratio(
            column.load_8.requests_per_s if column.load_8 else None,
            floor.load_8.requests_per_s if floor.load_8 else None,
        ),
        "cpu_per_req_x_floor": ratio(cpu_per_request_ms(column.load_8), cpu_per_request_ms(floor.load_8)),
    }


def verdicts(column: Column, floor: Column) -> dict[str, bool]:
    """PASS/FAIL of the targets, for the farmhost (inotify) column against the raw floor of the same run."""
    lat, cpu, rss = column.latency, column.idle_cpu_pct, column.idle_rss_mb
    wakeups = column.idle_wakeups_per_s
    x = ratios(column, floor)
    p50, rps, per_req = x["p50_x_floor"], x["rps_8_of_floor"], x["cpu_per_req_x_floor"]
    return {
        "p50": p50 is not None and p50 <= TARGET_P50_X_FLOOR,
        "p99": lat is not None and lat.p99_ms <= TARGET_P99_MS,
        "rps_8": rps is not None and rps >= TARGET_RPS_8_OF_FLOOR,
        "cpu_per_req": per_req is not None and per_req <= TARGET_CPU_PER_REQ_X_FLOOR,
        "idle_cpu": cpu is not None and cpu <= TARGET_IDLE_CPU_PCT,
        "idle_wakeups": wakeups is not None and wakeups <= TARGET_IDLE_WAKEUPS,
        "idle_rss": rss is not None and rss < TARGET_IDLE_RSS_MB,
    }


# ---------------------------------------------------------------------------------------------------------------
# Output


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100 or value.is_integer():
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _figure(column: Column, path: str) -> float | None:
    """`column.<part>.<figure>` (or `column.<figure>`), None when that part was not measured."""
    if path == "cpu_per_request_ms":
        return cpu_per_request_ms(column.load_8)
    value: Any = column
    for part in path.split("."):
        value = getattr(value, part, None) if value is not None else None
    return None if value is None else float(value)


# (label, figure path in a Column, target text, verdict key) - the rows of the table, in order.
ROWS: list[tuple[str, str, str, str | None]] = [
    ("ping p50, 1 group (ms)", "latency.p50_ms", f"<= {TARGET_P50_X_FLOOR:g}x fl", "p50"),
    ("ping p99, 1 group (ms)", "latency.p99_ms", f"<= {TARGET_P99_MS:g}", "p99"),
    ("ping mean, 1 group (ms)", "latency.mean_ms", "", None),
    ("  samples", "latency.n", "", None),
    ("  of which host processing p50 (ms)", "processing_p50_ms", "", None),
    ("req/s, 1 group", "load_1.requests_per_s", "", None),
    ("req/s, 8 groups", "load_8.requests_per_s", f">= {TARGET_RPS_8_OF_FLOOR:.0%} fl", "rps_8"),
    ("  p50 under load, 8 groups (ms)", "load_8.p50_ms", "", None),
    ("  host CPU under load, 8 g (%)", "load_8.host_cpu_pct", "", None),
    ("  host CPU per request, 8 g (ms)", "cpu_per_request_ms", f"<= {TARGET_CPU_PER_REQ_X_FLOOR:g}x fl", "cpu_per_req"),
    ("  client CPU under load, 8 g (%)", "load_8.client_cpu_pct", "", None),
    ("idle, 16 groups: CPU (% core)", "idle_cpu_pct", f"<= {TARGET_IDLE_CPU_PCT:g}", "idle_cpu"),
    ("idle, 16 groups: wake-ups/s", "idle_wakeups_per_s", f"<= {TARGET_IDLE_WAKEUPS:g}", "idle_wakeups"),
    ("idle, 16 groups: RSS (MB)", "idle_rss_mb", f"< {TARGET_IDLE_RSS_MB:g}", "idle_rss"),
]


def render(report: Report) -> str:
    """The table: one row per figure, one column per host, then the target and PASS/FAIL for farmhost."""
    cols = report.columns
    width = max(12, *(len(c.name) + 1 for c in cols))
    label_w = max(len(r[0]) for r in ROWS) + 2
    header = f"{'':<{label_w}}" + "".join(f"{c.name:>{width}}" for c in cols) + f"{'target':>12}  farmhost"
    lines = [header, "-" * len(header)]
    for label, path, target, key in ROWS:
        values = "".join(f"{_fmt(_figure(c, path)):>{width}}" for c in cols)
        verdict = "" if key is None else ("PASS" if report.verdicts.get(key) else "FAIL")
        lines.append(f"{label:<{label_w}}{values}{target:>12}  {verdict}")
    m = report.machine
    errors = sum(
        (c.latency.errors if c.latency else 0) + sum(t.errors + t.lost for t in (c.load_1, c.load_8) if t) for c in cols
    )
    fsync = "on" if report.options["client_fsync"] else "off"
    x = report.floor_ratios
    lines += [
        "",
        (
            f"farmhost against the raw floor of this run (fl): ping p50 {_fmt(x.get('p50_x_floor'))}x, "
            f"8-group rate {_fmt(100 * (x.get('rps_8_of_floor') or math.nan), 0)} %, "
            f"CPU per request {_fmt(x.get('cpu_per_req_x_floor'))}x"
        ),
        *machine_lines(report.date, m, report.wall_seconds),
        (
            f"client: dot-temp + rename (fsync {fsync}), inotify wait with a {POLL_FALLBACK_MS} ms directory-check "
            f"fallback; window {WINDOW} per group; client threads in one process"
        ),
        "reference floor (shared/ref/ipc-bench, same kind of machine): p50 0.26 ms, 0.65 ms with fsync both sides",
        f"errors or unanswered requests: {errors}",
        *busy_note(m),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse options, run, print the table (and JSON); always 0 unless the benchmark could not run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples: ~35 s instead of ~3 min")
    add_output_options(parser)
    parser.add_argument("--idle-only", action="store_true", help="only the idle row (16 groups, every idle host)")
    parser.add_argument("--client-fsync", action="store_true", help="the client fsyncs each request before rename")
    args = parser.parse_args(argv)

    def measure() -> Report:
        return run(QUICK if args.quick else FULL, bench_dir=args.dir, fsync=args.client_fsync, idle_only=args.idle_only)

    return report_run("ipc_roundtrip", measure, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
