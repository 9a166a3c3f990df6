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

    def collect(self, name: str, right: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """Read and parse a result like an agent, then delete it; returns whether it is `right` (default: success)."""
        path = os.path.join(self.results_dir, name)
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
        os.unlink(path)
        return isinstance(document, dict) and (right or succeeded)(document)


def ping(request_id: str) -> dict[str, Any]:
    """The cheapest request of the contract."""
    return {"type": "ping", "requestId": request_id}


def succeeded(document: dict[str, Any]) -> bool:
    """The right answer to a ping: `status` success."""
    return document.get("status") == "success"


@dataclass(frozen=True)
class Probe:
    """What a client sends (`make(requestId)`) and which result document counts as the right answer."""

    make: Callable[[str], dict[str, Any]] = ping
    right: Callable[[dict[str, Any]], bool] = succeeded


PING = Probe()


@dataclass
class Latency:
    """Sequential round trips of one host."""

    n: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors: int


def percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (the p99 of fewer than 100 samples is their maximum)."""
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)]


class Pinger:
    """One group's agent side sending pings (or another `probe`) one at a time and timing each round trip."""

    def __init__(self, group_dir: str, *, fsync: bool, probe: Probe = PING) -> None:
        self.group_dir = group_dir
        self._probe = probe
        self._actions = os.path.join(group_dir, "actions")
        self._waiter = ResultWaiter(os.path.join(group_dir, "action_results"))
        self._fsync = fsync
        self.prefix = f"s{os.getpid()}x{time.monotonic_ns()}"  # of every requestId it sends
        self._sent = 0

    def close(self) -> None:
        """Release the result watch."""
        self._waiter.close()

    def ping(self, *, timeout: float = ANSWER_TIMEOUT_S) -> tuple[float, bool] | None:
        """One round trip: (milliseconds, whether it succeeded), or None when no answer came within `timeout`."""
        request_id = f"{self.prefix}-{self._sent:07d}"
        self._sent += 1
        name = f"{request_id}.json"
        started = time.perf_counter()
        write_request(self._actions, request_id, self._probe.make(request_id), fsync=self._fsync)
        if not self._waiter.arrived((name,), deadline=started + timeout):
            return None
        ok = self._waiter.collect(name, self._probe.right)
        return (time.perf_counter() - started) * 1000, ok


def sequential(
    group_dir: str, *, n: int, warmup: int, gap: Callable[[], float], fsync: bool, probe: Probe = PING
) -> Latency:
    """`warmup` + `n` ping (or `probe`) round trips one after another; the first `warmup` are not counted."""
    pinger = Pinger(group_dir, fsync=fsync, probe=probe)
    try:
        return interleaved([pinger], n=n, warmup=warmup, gap=gap)[0]
    finally:
        pinger.close()


def interleaved(pingers: list[Pinger], *, n: int, warmup: int, gap: Callable[[], float]) -> list[Latency]:
    """`warmup` + `n` rounds of one round trip per pinger, in turn, `gap()` apart: a Latency per pinger.

    Taking turns puts every pinger under the same moment's machine, so their difference is not a drift in load.
    """
    samples, errors = interleaved_samples(pingers, n=n, warmup=warmup, gap=gap)
    return [summary(ms, failed) for ms, failed in zip(samples, errors, strict=True)]


def interleaved_samples(
    pingers: list[Pinger], *, n: int, warmup: int, gap: Callable[[], float]
) -> tuple[list[list[float]], list[int]]:
    """What `interleaved` summarises: each pinger's round trips (ms) and its count of wrong answers."""
    samples: list[list[float]] = [[] for _ in pingers]
    errors = [0 for _ in pingers]
    for i in range(warmup + n):
        for k, pinger in enumerate(pingers):
            answer = pinger.ping()
            if answer is None:
                raise RuntimeError(f"no answer to a request in {pinger.group_dir} within {ANSWER_TIMEOUT_S:g} s")
            if i >= warmup:
                samples[k].append(answer[0])
                errors[k] += not answer[1]
            time.sleep(gap())
    return samples, errors


def summary(samples_ms: list[float], errors: int) -> Latency:
    """The percentiles, mean and maximum of round-trip times (in any order)."""
    ordered = sorted(samples_ms)
    return Latency(
        n=len(ordered),
        p50_ms=percentile(ordered, 0.50),
        p95_ms=percentile(ordered, 0.95),
        p99_ms=percentile(ordered, 0.99),
        mean_ms=statistics.fmean(ordered),
        max_ms=ordered[-1],
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


def windowed(group_dir: str, *, window: int, start_at: float, stop_at: float, fsync: bool, out: WindowCount,
             probe: Probe = PING) -> None:  # fmt: skip
    """Keep `window` pings (or `probe`s) outstanding in one group; count those answered in [`start_at`, `stop_at`)."""
    actions, waiter = os.path.join(group_dir, "actions"), ResultWaiter(os.path.join(group_dir, "action_results"))
    outstanding: dict[str, float] = {}
    prefix = f"w{threading.get_ident()}x{time.monotonic_ns()}"
    seq = 0

    def send() -> None:
        nonlocal seq
        request_id = f"{prefix}-{seq:08d}"
        seq += 1
        outstanding[f"{request_id}.json"] = time.perf_counter()
        write_request(actions, request_id, probe.make(request_id), fsync=fsync)

    try:
        for _ in range(window):
            send()
        while outstanding and time.perf_counter() < stop_at + DRAIN_TIMEOUT_S:
            for name in waiter.arrived(outstanding, deadline=stop_at + DRAIN_TIMEOUT_S):
                sent = outstanding.pop(name)
                ok = waiter.collect(name, probe.right)
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
    """Sustained request rate over a window, all groups (client threads) together."""

    groups: int  # client threads (lanes)
    window: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    lost: int
    host_cpu_pct: float  # of one core, while the load ran
    client_cpu_pct: float  # this process (all client threads)
    host_cpu_pct_each: list[float] = field(default_factory=list)  # per host process, when there are several


def throughput(host: Host, *, groups: int, seconds: float, ramp: float, fsync: bool) -> Throughput:
    """One client thread per group, each keeping WINDOW pings outstanding, for `seconds` after a ramp."""
    lanes = [(host.group_dir(i), PING) for i in range(groups)]
    return streams(lanes, [host.pid], window=WINDOW, seconds=seconds, ramp=ramp, fsync=fsync)


def streams(lanes: list[tuple[str, Probe]], pids: list[int], *, window: int, seconds: float, ramp: float,
            fsync: bool) -> Throughput:  # fmt: skip
    """One client thread per (group dir, probe) lane, each keeping `window` requests outstanding.

    Several lanes may share a group dir (each waits for its own results). Requests answered in the `seconds` after
    a ramp are counted; the host CPU is that of every process in `pids` together.
    """
    counts = [WindowCount() for _ in lanes]
    start_at = time.perf_counter() + ramp
    stop_at = start_at + seconds
    threads = [
        threading.Thread(
            target=windowed,
            kwargs={
                "group_dir": group_dir,
                "window": window,
                "start_at": start_at,
                "stop_at": stop_at,
                "fsync": fsync,
                "out": counts[i],
                "probe": probe,
            },
            daemon=True,
        )
        for i, (group_dir, probe) in enumerate(lanes)
    ]
    for thread in threads:
        thread.start()
    while time.perf_counter() < start_at:
        time.sleep(0.005)
    host_before, client_before = [cpu_seconds(pid) for pid in pids], _own_cpu_seconds()
    while time.perf_counter() < stop_at:
        time.sleep(0.005)
    host_cpu = [cpu_seconds(pid) - before for pid, before in zip(pids, host_before, strict=True)]
    client_cpu = _own_cpu_seconds() - client_before
    for thread in threads:
        thread.join(stop_at - time.perf_counter() + DRAIN_TIMEOUT_S + 1)
    failures = [f"{lanes[i][0]}: {c.failure}" for i, c in enumerate(counts) if c.failure]
    if failures:
        raise RuntimeError(f"a client thread failed: {failures[0]}")
    latencies = sorted(ms for count in counts for ms in count.latencies_ms) or [math.nan]
    return Throughput(
        groups=len(lanes),
        window=window,
        seconds=seconds,
        requests_per_s=sum(c.done for c in counts) / seconds,
        p50_ms=percentile(latencies, 0.5),
        p99_ms=percentile(latencies, 0.99),
        errors=sum(c.errors for c in counts),
        lost=sum(c.lost for c in counts),
        host_cpu_pct=100 * sum(host_cpu) / seconds,
        client_cpu_pct=100 * client_cpu / seconds,
        host_cpu_pct_each=[100 * cpu / seconds for cpu in host_cpu] if len(pids) > 1 else [],
    )


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
