"""Where one request's time goes on the quiet path: the host's phases of a request against its round trip.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/request_phases.py            # 2,000 pings and 300 memory searches, ~35 s
    .venv/bin/python bench/request_phases.py --quick    # 300 pings and 50 searches, ~12 s
    .venv/bin/python bench/request_phases.py --searches 0 --json out.json

A real ``farmhost run`` daemon on a fresh data dir with one group (``g00``, main, made by ``farmhost group add``)
whose workspace holds a generated memory of ``--chunks`` chunks (3,000: as ``bench/memory_search.py`` makes it).
The client of ``bench/ipc_roundtrip.py`` sends, one at a time and 3 ms apart:

- pings, each followed by one to the raw floor host of that benchmark (inotify, no validation, no ledger, the
  result fsync'd), so the two round trips see the same moment of the machine;
- then ``memory_search`` requests of random queries (after 20 unmeasured ones: the first builds the index).

The host's phases are those it writes itself in the request log line of each request (``phasesUs``,
farmhost/ipc/phases.py): claim, read, decode, ledger, handler, envelope, result, log. They are contiguous, so
their sum is the host's whole time from the listing that found the file to the request log's own write. What the
sum leaves of the round trip (``outside``) is the client's write, the kernel's inotify events, the event loop's
and the client's wake-ups, and the client reading the result. The biggest phase (by p50) is named. The host's CPU
time per request (``/proc/<pid>/task/*/schedstat``, less its idle rate measured just before) is printed beside
the floor's.

Timed apart in this process, to read the phases against: the request log line's own write (which its line cannot
hold: the daemon's `NdjsonLog` on the same record), an ``asyncio.to_thread`` of nothing (the result phase makes
one) and a ping's result file created, written, fsynced and renamed directly.

The script reports; it never gates: the exit status is 0 whatever the figures (2 on a setup failure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memory_search import QUERIES, SEED, make_workspace
from roundtrip_client import Pinger, Probe, interleaved_samples, percentile
from roundtrip_hosts import FarmhostDaemon, ScriptHost, folder_name, inotify_host_main, make_data_dir
from roundtrip_machine import file_costs, machine_info
from roundtrip_report import add_output_options, busy_note, log, machine_lines, report_run

from farmhost.files import DIR_FLAGS, commit_atomic, dump_json, prepare_atomic
from farmhost.ipc import phases
from farmhost.layout import DataLayout
from farmhost.ndjson_log import NdjsonLog

GAP_S = 0.003  # between requests: the host goes idle, as between an agent's tool calls (as ipc_roundtrip.py)
PHASES = [phases.CLAIM, phases.READ, phases.DECODE, phases.LEDGER, phases.HANDLER, phases.ENVELOPE, phases.SETTLE,
          phases.RESULT, phases.LOG]  # fmt: skip
LOG_WRITE = "log write"  # the request log line's own write, timed apart
SEARCH_WARMUP = 20
IDLE_S = 3.0  # the daemon's own timers, measured before the requests and taken out of its CPU per request


def task_cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process (schedstat, in ns: finer than /proc/<pid>/stat's clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


class CpuMeter:
    """A process's CPU time per request over a run, less what it spends idle (its timers) in as long."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.idle_ns_per_s = 0.0
        self._cpu = self._at = 0.0

    def measure_idle(self, seconds: float) -> None:
        """CPU per second with nothing sent (call while no request is in flight)."""
        cpu, at = task_cpu_ns(self.pid), time.perf_counter()
        time.sleep(seconds)
        self.idle_ns_per_s = (task_cpu_ns(self.pid) - cpu) / (time.perf_counter() - at)

    def start(self) -> None:
        """The run begins."""
        self._cpu, self._at = task_cpu_ns(self.pid), time.perf_counter()

    def per_request_us(self, n: int) -> float:
        """Microseconds of CPU per request since `start`, the idle rate taken out."""
        busy = task_cpu_ns(self.pid) - self._cpu - self.idle_ns_per_s * (time.perf_counter() - self._at)
        return busy / 1000 / n


@dataclass
class Figures:
    """p50, p99 and mean of one measure, in microseconds."""

    p50_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, samples_us: list[float]) -> Figures:
        """The figures of some samples (NaN when there are none)."""
        if not samples_us:
            return cls(math.nan, math.nan, math.nan)
        ordered = sorted(samples_us)
        return cls(percentile(ordered, 0.5), percentile(ordered, 0.99), statistics.fmean(ordered))


@dataclass
class Breakdown:
    """One kind of request: its phases, their sum and its round trip."""

    name: str
    n: int
    phases: dict[str, Figures]
    phase_sum: Figures  # per request, the sum of its phases
    round_trip: Figures  # the client's: rename of the request to the result read
    outside: Figures  # per request, round trip minus the sum of its phases
    host_cpu_us: float  # the daemon's CPU time over the run per request, its idle rate taken out
    biggest: str  # the phase with the highest p50
    floor: Figures | None = None  # the raw floor's round trip, interleaved with this one
    floor_cpu_us: float | None = None
    host_idle_cpu_pct: float | None = None  # the daemon with nothing sent (taken out of host_cpu_us)
    errors: int = 0


@dataclass
class Report:
    """The run, as `--json` dumps it."""

    date: str
    machine: dict[str, Any]
    options: dict[str, Any]
    kinds: list[Breakdown] = field(default_factory=list)
    log_write: Figures | None = None  # the request log line's own write, timed apart
    thread_hop: Figures | None = None  # an `asyncio.to_thread` of nothing: the result phase makes one
    result_io: Figures | None = None  # a ping's result file prepared and published, called directly
    wall_seconds: float = 0.0


def search_probe(rng: random.Random) -> Probe:
    """A `memory_search` of a random query; right when it succeeded."""

    def make(request_id: str) -> dict[str, Any]:
        params = {"query": rng.choice(QUERIES), "topK": 8}
        return {"type": "memory_action", "action": "memory_search", "requestId": request_id, "params": params}

    return Probe(make=make, right=lambda doc: doc.get("status") == "success")


def round_trips(pingers: list[Pinger], *, n: int, warmup: int) -> tuple[list[list[float]], list[int]]:
    """`warmup` + `n` rounds of one request per pinger in turn, GAP_S apart: round trips (us) and errors each."""
    samples, errors = interleaved_samples(pingers, n=n, warmup=warmup, gap=lambda: GAP_S)
    return [[ms * 1000 for ms in each] for each in samples], errors


def logged_phases(daemon: FarmhostDaemon, prefix: str, n: int) -> list[dict[str, int]]:
    """`phasesUs` of the last `n` requests whose requestId starts with `prefix`, in the order they were logged."""
    lines = (daemon.data_dir / "logs" / "requests.ndjson").read_text(encoding="utf-8").splitlines()
    rows = [row for row in map(json.loads, lines) if str(row.get("requestId", "")).startswith(prefix)]
    if len(rows) < n or any("phasesUs" not in row for row in rows[-n:]):
        raise RuntimeError("the request log has no phasesUs for these requests: a farmhost without them?")
    return [row["phasesUs"] for row in rows[-n:]]


def breakdown(name: str, logged: list[dict[str, int]], round_trip_us: list[float], cpu_us: float) -> Breakdown:
    """The phases of `logged` against the round trips of the same requests (same order)."""
    sums = [float(sum(p.values())) for p in logged]
    met = [phase for phase in PHASES if any(phase in p for p in logged)]
    figures = {phase: Figures.of([float(p.get(phase, 0)) for p in logged]) for phase in met}
    return Breakdown(
        name=name,
        n=len(logged),
        phases=figures,
        phase_sum=Figures.of(sums),
        round_trip=Figures.of(round_trip_us),
        outside=Figures.of([rt - s for rt, s in zip(round_trip_us, sums, strict=True)]),
        host_cpu_us=cpu_us,
        biggest=max(met, key=lambda phase: (figures[phase].p50_us, figures[phase].mean_us)),
    )


def measure_pings(daemon: FarmhostDaemon, floor: ScriptHost, *, n: int, warmup: int) -> Breakdown:
    """Pings to farmhost and to the raw floor in turn; the phases of farmhost's."""
    host, raw = Pinger(daemon.group_dir(0), fsync=False), Pinger(floor.group_dir(0), fsync=False)
    meters = CpuMeter(daemon.pid), CpuMeter(floor.pid)
    try:
        round_trips([host, raw], n=warmup, warmup=0)
        for meter in meters:  # one after the other: a sleeping process's CPU is not disturbed by the other's
            meter.measure_idle(IDLE_S / 2)
        for meter in meters:
            meter.start()
        (host_us, raw_us), (errors, _) = round_trips([host, raw], n=n, warmup=0)
        host_cpu, floor_cpu = (meter.per_request_us(n) for meter in meters)
    finally:
        host.close()
        raw.close()
    result = breakdown("ping", logged_phases(daemon, host.prefix, n), host_us, host_cpu)
    result.floor, result.floor_cpu_us, result.errors = Figures.of(raw_us), floor_cpu, errors
    result.host_idle_cpu_pct = meters[0].idle_ns_per_s / 1e7
    return result


def measure_searches(daemon: FarmhostDaemon, *, n: int, chunks: int) -> Breakdown:
    """`memory_search` requests of random queries, after SEARCH_WARMUP unmeasured ones."""
    searcher = Pinger(daemon.group_dir(0), fsync=False, probe=search_probe(random.Random(SEED)))
    meter = CpuMeter(daemon.pid)
    try:
        round_trips([searcher], n=SEARCH_WARMUP, warmup=0)
        meter.measure_idle(IDLE_S / 2)
        meter.start()
        (samples,), (errors,) = round_trips([searcher], n=n, warmup=0)
        cpu = meter.per_request_us(n)
    finally:
        searcher.close()
    result = breakdown(f"memory_search, {chunks:,} chunks", logged_phases(daemon, searcher.prefix, n), samples, cpu)
    result.errors = errors
    result.host_idle_cpu_pct = meter.idle_ns_per_s / 1e7
    return result


def _noop() -> None:
    pass


def time_thread_hop(n: int) -> Figures:
    """`await asyncio.to_thread` of a function that does nothing, n times on a fresh event loop."""

    async def hops() -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter_ns()
            await asyncio.to_thread(_noop)
            samples.append((time.perf_counter_ns() - started) / 1000)
        return samples

    return Figures.of(asyncio.run(hops()))


def time_result_io(data_dir: Path, scratch: Path, n: int) -> Figures:
    """A ping's result document prepared (create, write, fsync) and published (rename), n times, no thread."""
    record = json.loads((data_dir / "logs" / "requests.ndjson").read_text(encoding="utf-8").splitlines()[-1])
    document = dump_json({"requestId": record["requestId"], "type": "ping", "action": None, "status": "success",
                          "result": {"pong": True}, "error": None, "errorCode": None,
                          "executedAt": record["ts"], "durationMs": 0})  # fmt: skip
    scratch.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(scratch, DIR_FLAGS)
    samples: list[float] = []
    try:
        for i in range(n):
            started = time.perf_counter_ns()
            commit_atomic(dir_fd, prepare_atomic(dir_fd, f"r{i}.json", document), f"r{i}.json")
            samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        os.close(dir_fd)
    return Figures.of(samples)


def time_log_write(data_dir: Path, scratch: Path, n: int) -> Figures:
    """The request log's own write of the daemon's last record, n times, into a scratch log (NdjsonLog)."""
    record = json.loads((data_dir / "logs" / "requests.ndjson").read_text(encoding="utf-8").splitlines()[-1])
    request_log = NdjsonLog(scratch, max_bytes=10 * 1024 * 1024)  # the default FARMHOST_REQUEST_LOG_BYTES
    samples: list[float] = []
    try:
        for _ in range(n):
            started = time.perf_counter_ns()
            request_log.write(record)
            samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        request_log.close()
    return Figures.of(samples)


def run(*, pings: int, searches: int, chunks: int, bench_dir: Path) -> Report:
    """Build the data dir, start the daemon and the floor, measure, and return the report."""
    wall = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="farmhost-phases-", dir=bench_dir))
    report = Report(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=machine_info(root),
        options={"pings": pings, "searches": searches, "chunks": chunks, "gap_ms": GAP_S * 1000},
    )
    try:
        log(f"creating a data dir with `farmhost group add` under {root}")
        data_dir = make_data_dir(root / "fh", 1)
        if searches:
            made = make_workspace(root / "memory", chunks, SEED + chunks)
            shutil.copytree(made.root, DataLayout(data_dir).workspace(folder_name(0)), dirs_exist_ok=True)
        daemon = FarmhostDaemon(data_dir)
        try:
            floor = ScriptHost(root / "floor", 1, inotify_host_main, 0)
            try:
                log(
                    f"{pings} pings (+{pings // 10} warm-up), each beside one to the raw floor, {GAP_S * 1000:g} ms apart"
                )
                report.kinds.append(measure_pings(daemon, floor, n=pings, warmup=pings // 10))
            finally:
                floor.stop()
            if searches:
                log(f"{searches} memory_search requests (+{SEARCH_WARMUP} warm-up) on {chunks:,} chunks")
                report.kinds.append(measure_searches(daemon, n=searches, chunks=chunks))
        finally:
            daemon.stop()
        log("references: the request log's write, a thread hop and the result file's I/O, each timed apart")
        report.log_write = time_log_write(data_dir, root / "log-write", pings)
        report.thread_hop = time_thread_hop(min(pings, 1000))
        report.result_io = time_result_io(data_dir, root / "result-io", min(pings, 1000))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.machine["loadavg_at_end"] = os.getloadavg()[0]
    report.machine["at_end"] = file_costs(bench_dir)
    report.wall_seconds = round(time.perf_counter() - wall, 1)
    return report


def _us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _row(label: str, f: Figures, share: str = "") -> str:
    return f"| {label:<38} | {_us(f.p50_us):>8} | {_us(f.p99_us):>8} | {_us(f.mean_us):>8} | {share:>7} |"


def render(report: Report) -> str:
    """A markdown table per kind of request, then the machine."""
    lines: list[str] = []
    for kind in report.kinds:
        errors = f", {kind.errors} wrong answers" if kind.errors else ""
        lines += [f"{kind.name}: {kind.n} requests, {GAP_S * 1000:g} ms apart{errors}", ""]
        lines += [f"| {'phase (us)':<38} | {'p50':>8} | {'p99':>8} | {'mean':>8} | {'of sum':>7} |",
                  f"|{'-' * 40}|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|{'-' * 8}:|"]  # fmt: skip
        total = kind.phase_sum.mean_us
        for phase, figures in kind.phases.items():
            lines.append(_row(phase, figures, f"{100 * figures.mean_us / total:.0f} %"))
        lines += [
            _row("sum of the phases (per request)", kind.phase_sum),
            _row("round trip (client)", kind.round_trip),
            _row("outside the phases (round trip - sum)", kind.outside),
        ]
        if kind.floor is not None:
            lines.append(_row("raw floor round trip (interleaved)", kind.floor))
        cpu = f"host CPU per request {kind.host_cpu_us:,.0f} us"
        if kind.floor_cpu_us is not None:
            cpu += f" (raw floor {kind.floor_cpu_us:,.0f} us)"
        if kind.host_idle_cpu_pct is not None:
            cpu += f", beyond the daemon's idle {kind.host_idle_cpu_pct:.2f} % of a core"
        big = kind.phases[kind.biggest]
        lines += [
            "",
            f"biggest phase: {kind.biggest} (p50 {_us(big.p50_us)} us); of sum: each phase's mean over the sum's",
            cpu,
            "",
        ]
    references = [
        ("the request log line's own write (NdjsonLog; after the log phase, not in the sum)", report.log_write),
        ("an asyncio.to_thread of nothing (the result phase makes one)", report.thread_hop),
        ("a ping's result file prepared and published, called directly (create, write, fsync, rename)",
         report.result_io),
    ]  # fmt: skip
    lines.append("timed apart in this process, p50 / p99 (us):")
    lines += [f"- {what}: {_us(f.p50_us)} / {_us(f.p99_us)}" for what, f in references if f is not None]
    lines += ["", *machine_lines(report.date, report.machine, report.wall_seconds), *busy_note(report.machine)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse options, run, print the tables (and JSON); 0 unless the benchmark could not run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="300 pings and 50 searches (~12 s)")
    parser.add_argument("--pings", type=int, help="measured pings (default 2,000; --quick 300)")
    parser.add_argument("--searches", type=int, help="measured memory_search requests (default 300; 0: none)")
    parser.add_argument("--chunks", type=int, default=3000, help="memory chunks in the group's workspace")
    add_output_options(parser)
    args = parser.parse_args(argv)
    pings = args.pings if args.pings is not None else (300 if args.quick else 2000)
    searches = args.searches if args.searches is not None else (50 if args.quick else 300)

    def measure() -> Report:
        return run(pings=pings, searches=searches, chunks=args.chunks, bench_dir=args.dir)

    return report_run("request_phases", measure, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
