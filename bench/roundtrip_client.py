"""The agent side of the IPC benchmark: drop requests like an agent, wait for results, time them."""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from inotify_simple import INotify
from inotify_simple import flags as inotify_flags
from roundtrip_hosts import Host, cpu_seconds

# A client that saw no inotify event for this long checks the directory itself (an agent's safety net).
POLL_FALLBACK_MS = 100
WINDOW = 16
DRAIN_TIMEOUT_S = 5.0
ANSWER_TIMEOUT_S = 30.0  # a sequential request not answered by then means the host is broken


def write_request(actions_dir: str, request_id: str, payload: dict[str, Any], *, fsync: bool) -> None:
    """Drop a request like an agent: O_EXCL temp file whose name starts with '.', then rename into place."""
    name = f"{request_id}.json"
    tmp = os.path.join(actions_dir, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(payload).encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(actions_dir, name))


class ResultWaiter:
    """Waits for result files in one `action_results/` directory: inotify, with a directory-check fallback."""

    def __init__(self, results_dir: str) -> None:
        self.results_dir = results_dir
        self._inotify = INotify()
        self._inotify.add_watch(results_dir, inotify_flags.MOVED_TO | inotify_flags.CLOSE_WRITE)

    def close(self) -> None:
        """Release the inotify instance."""
        self._inotify.close()

    def arrived(self, wanted: Collection[str], *, deadline: float) -> list[str]:
        """Block until one of the `wanted` file names is in the directory; returns those that are ([] at deadline)."""
        checked = time.perf_counter()
        while time.perf_counter() < deadline:
            events = self._inotify.read(timeout=POLL_FALLBACK_MS)
            got = list({event.name for event in events if event.name in wanted})
            if not got and time.perf_counter() - checked >= POLL_FALLBACK_MS / 1000:
                # Nothing we wait for was notified for a while: look ourselves, in case an event was lost.
                got = [name for name in wanted if os.path.exists(os.path.join(self.results_dir, name))]
                checked = time.perf_counter()
            if got:
                return got
        return []

    def collect(self, name: str) -> bool:
        """Read and parse a result like an agent, then delete it; returns whether it says success."""
        path = os.path.join(self.results_dir, name)
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
        os.unlink(path)
        return isinstance(document, dict) and document.get("status") == "success"


def ping(request_id: str) -> dict[str, Any]:
    """The cheapest request of the contract."""
    return {"type": "ping", "requestId": request_id}


@dataclass
class Latency:
    """Sequential round trips of one host."""

    n: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int


def percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (the p99 of fewer than 100 samples is their maximum)."""
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


class Pinger:
    """One group's agent side sending pings one at a time and timing each round trip."""

    def __init__(self, group_dir: str, *, fsync: bool) -> None:
        self.group_dir = group_dir
        self._actions = os.path.join(group_dir, "actions")
        self._waiter = ResultWaiter(os.path.join(group_dir, "action_results"))
        self._fsync = fsync
        self._prefix = f"s{os.getpid()}x{time.monotonic_ns()}"
        self._sent = 0

    def close(self) -> None:
        """Release the result watch."""
        self._waiter.close()

    def ping(self, *, timeout: float = ANSWER_TIMEOUT_S) -> tuple[float, bool] | None:
        """One round trip: (milliseconds, whether it succeeded), or None when no answer came within `timeout`."""
        request_id = f"{self._prefix}-{self._sent:07d}"
        self._sent += 1
        name = f"{request_id}.json"
        started = time.perf_counter()
        write_request(self._actions, request_id, ping(request_id), fsync=self._fsync)
        if not self._waiter.arrived((name,), deadline=started + timeout):
            return None
        ok = self._waiter.collect(name)
        return (time.perf_counter() - started) * 1000, ok


def sequential(group_dir: str, *, n: int, warmup: int, gap: Callable[[], float], fsync: bool) -> Latency:
    """`warmup` + `n` ping round trips one after another; the first `warmup` are not counted."""
    pinger = Pinger(group_dir, fsync=fsync)
    samples: list[float] = []
    errors = 0
    try:
        for i in range(warmup + n):
            answer = pinger.ping()
            if answer is None:
                raise RuntimeError(f"no answer to a ping in {group_dir} within {ANSWER_TIMEOUT_S:g} s")
            if i >= warmup:
                samples.append(answer[0])
                errors += not answer[1]
            time.sleep(gap())
    finally:
        pinger.close()
    samples.sort()
    return Latency(
        n=len(samples),
        p50_ms=percentile(samples, 0.50),
        p99_ms=percentile(samples, 0.99),
        mean_ms=statistics.fmean(samples),
        max_ms=samples[-1],
        errors=errors,
    )


@dataclass
class WindowCount:
    """What one client thread of a throughput run saw."""

    done: int = 0
    errors: int = 0
    lost: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    failure: str | None = None  # the client thread died: the run is void


def windowed(group_dir: str, *, window: int, start_at: float, stop_at: float, fsync: bool, out: WindowCount) -> None:
    """Keep `window` pings outstanding in one group; count those answered between `start_at` and `stop_at`."""
    actions, waiter = os.path.join(group_dir, "actions"), ResultWaiter(os.path.join(group_dir, "action_results"))
    outstanding: dict[str, float] = {}
    prefix = f"w{threading.get_ident()}x{time.monotonic_ns()}"
    seq = 0

    def send() -> None:
        nonlocal seq
        request_id = f"{prefix}-{seq:08d}"
        seq += 1
        outstanding[f"{request_id}.json"] = time.perf_counter()
        write_request(actions, request_id, ping(request_id), fsync=fsync)

    try:
        for _ in range(window):
            send()
        while outstanding and time.perf_counter() < stop_at + DRAIN_TIMEOUT_S:
            for name in waiter.arrived(outstanding, deadline=stop_at + DRAIN_TIMEOUT_S):
                sent = outstanding.pop(name)
                ok = waiter.collect(name)
                now = time.perf_counter()
                if start_at <= now < stop_at:
                    out.done += 1
                    out.errors += not ok
                    out.latencies_ms.append((now - sent) * 1000)
                if now < stop_at:
                    send()
        out.lost += len(outstanding)
    except (OSError, ValueError) as err:  # reported by throughput(), which runs this in a thread
        out.failure = f"{type(err).__name__}: {err}"
    finally:
        waiter.close()


@dataclass
class Throughput:
    """Sustained ping rate over a window, all groups together."""

    groups: int
    window: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    lost: int
    host_cpu_pct: float  # of one core, while the load ran
    client_cpu_pct: float  # this process (all client threads)


def throughput(host: Host, *, groups: int, seconds: float, ramp: float, fsync: bool) -> Throughput:
    """One client thread per group, each keeping WINDOW requests outstanding, for `seconds` after a ramp."""
    counts = [WindowCount() for _ in range(groups)]
    start_at = time.perf_counter() + ramp
    stop_at = start_at + seconds
    threads = [
        threading.Thread(
            target=windowed,
            kwargs={
                "group_dir": host.group_dir(i),
                "window": WINDOW,
                "start_at": start_at,
                "stop_at": stop_at,
                "fsync": fsync,
                "out": counts[i],
            },
            daemon=True,
        )
        for i in range(groups)
    ]
    for thread in threads:
        thread.start()
    while time.perf_counter() < start_at:
        time.sleep(0.005)
    host_cpu, client_cpu = cpu_seconds(host.pid), _own_cpu_seconds()
    while time.perf_counter() < stop_at:
        time.sleep(0.005)
    host_cpu, client_cpu = cpu_seconds(host.pid) - host_cpu, _own_cpu_seconds() - client_cpu
    for thread in threads:
        thread.join(stop_at - time.perf_counter() + DRAIN_TIMEOUT_S + 1)
    failures = [f"{host.group_dir(i)}: {c.failure}" for i, c in enumerate(counts) if c.failure]
    if failures:
        raise RuntimeError(f"a client thread failed: {failures[0]}")
    latencies = sorted(ms for count in counts for ms in count.latencies_ms) or [math.nan]
    return Throughput(
        groups=groups,
        window=WINDOW,
        seconds=seconds,
        requests_per_s=sum(c.done for c in counts) / seconds,
        p50_ms=percentile(latencies, 0.5),
        p99_ms=percentile(latencies, 0.99),
        errors=sum(c.errors for c in counts),
        lost=sum(c.lost for c in counts),
        host_cpu_pct=100 * host_cpu / seconds,
        client_cpu_pct=100 * client_cpu / seconds,
    )


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
