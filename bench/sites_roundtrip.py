"""Several sites over MQTT: a farm action carried to another farmhost and back, beside the same action run locally.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/sites_roundtrip.py            # full run, about 70 s
    .venv/bin/python bench/sites_roundtrip.py --quick    # ~25 s smoke run, too few samples to quote
    .venv/bin/python bench/sites_roundtrip.py --json out.json
    .venv/bin/python bench/sites_roundtrip.py --broker-nodelay   # the broker with `set_tcp_nodelay true`

One Mosquitto (``/usr/sbin/mosquitto``: anonymous, no persistence, a free port on 127.0.0.1) and two
``python -m farmhost run`` daemons on it, ``FARMHOST_SITE`` A = ``pumphouse`` and B = ``greenhouse``, each on a fresh
data dir with 4 groups (g00 is main) added with ``farmhost group add``. Home Assistant is not configured, so
``ha_get_status`` is answered ``upstream_unavailable`` at once wherever it runs: the figures are the transport and
the routing, not HA. The first request waits until the broker holds ``online`` on both sites' availability topics.

- Sequential: A's main group sends, in turn and 3 ms apart, a ping (the raw IPC floor), ``ha_get_status`` without
  ``site`` (answered by A: the baseline) and ``ha_get_status`` with ``"site": "greenhouse"`` (carried to B, run by
  B's main group, the answer written back at A: cross-site); the overhead is cross-site minus local.
- Streams: 8 client threads at once, each one request at a time, for a fixed window: 4 in A's main group calling B
  plus 4 in B's main group calling A; then the same local farm action in the two main groups (no transport); then
  pings in 8 groups, 4 per site (the unloaded local engine).

Every answer is checked: the right one is ``upstream_unavailable`` with the error of the site it was meant to run at
(``site greenhouse: ...`` for a call to B), ``success`` for a ping. The script reports; it never gates: the exit
status is 0 whatever the figures (2 on a setup failure).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from roundtrip_client import PING, Latency, Pinger, Probe, Throughput, interleaved, percentile, streams
from roundtrip_hosts import FarmhostDaemon, make_data_dir, terminate
from roundtrip_machine import file_costs, machine_info
from roundtrip_report import add_output_options, busy_note, log, machine_lines, report_run

MOSQUITTO = "/usr/sbin/mosquitto"
SITE_A, SITE_B = "pumphouse", "greenhouse"
GROUPS_PER_SITE = 4
STREAMS_PER_SITE = 4
ACTION = "ha_get_status"
EXPECTED_CODE = "upstream_unavailable"  # no HA_URL/HA_TOKEN: the action fails at once, wherever it runs
GAP_S = 0.003  # between sequential requests, as between an agent's tool calls (bench/ipc_roundtrip.py)
ONLINE_TIMEOUT_S = 30.0
AVAILABILITY = "farmhost/+/availability"  # retained `online` / `offline` per site (docs/mqtt.md)


@dataclass
class Plan:
    """How many samples and seconds each measurement gets."""

    n: int  # sequential round trips of each kind, after the warm-up
    warmup: int
    load_seconds: float  # the counted window of each streams run
    ramp_seconds: float  # load before the window starts


FULL = Plan(n=300, warmup=30, load_seconds=10.0, ramp_seconds=0.5)
QUICK = Plan(n=60, warmup=10, load_seconds=3.0, ramp_seconds=0.5)


@dataclass
class Report:
    """The whole run, as `--json` dumps it."""

    date: str
    machine: dict[str, Any]
    options: dict[str, Any]
    sites: dict[str, str]
    online_after_s: float = 0.0  # from both daemons alive to the broker holding `online` for both
    first_call_ms: float = 0.0  # the first cross-site call once both were online
    sequential: dict[str, Latency] = field(default_factory=dict)
    host_p50_ms: dict[str, float] = field(default_factory=dict)  # site A's own durationMs for each kind
    overhead_ms: dict[str, float] = field(default_factory=dict)
    loads: dict[str, Throughput] = field(default_factory=dict)
    log_notes: list[str] = field(default_factory=list)  # warnings and errors the daemons and the broker logged
    wall_seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# The broker and the requests


class Mosquitto:
    """A broker on a free port of 127.0.0.1, its config and log in `root`."""

    def __init__(self, root: Path, *, nodelay: bool = False) -> None:
        if not Path(MOSQUITTO).exists():
            raise RuntimeError(f"{MOSQUITTO} is not installed (scripts/debian-packages installs mosquitto)")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        config = root / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false"]
        config.write_text("\n".join([*lines, *(["set_tcp_nodelay true"] if nodelay else [])]) + "\n")
        self.log_path = root / "mosquitto.log"
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
        self.pid = self._proc.pid
        self.url = f"mqtt://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        terminate(self._proc, 5)


def mosquitto_version() -> str:
    """`mosquitto version 2.0.11` -> `2.0.11` (`?` when it cannot tell)."""
    with contextlib.suppress(OSError):
        done = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, check=False)
        words = (done.stdout or done.stderr).split("\n", 1)[0].split()
        return words[-1] if words else "?"
    return "?"


def wait_online(port: int, sites: set[str], timeout: float) -> None:
    """Block until the broker holds `online` on `farmhost/<site>/availability` for every site in `sites`."""
    state: dict[str, str] = {}
    everyone = threading.Event()

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        client.subscribe(AVAILABILITY, qos=1)

    def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        state[message.topic.split("/")[1]] = message.payload.decode(errors="replace")
        if all(state.get(site) == "online" for site in sites):
            everyone.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sites-bench-{os.getpid()}")
    client.on_connect, client.on_message = on_connect, on_message
    deadline = time.monotonic() + timeout
    while True:  # the broker takes a few ms to listen
        try:
            client.connect("127.0.0.1", port)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto does not accept connections on port {port}") from None
            time.sleep(0.02)
    client.loop_start()
    try:
        if not everyone.wait(max(deadline - time.monotonic(), 0.0)):
            raise RuntimeError(f"the broker did not hold `online` for {sorted(sites)} within {timeout:g} s: {state}")
    finally:
        client.disconnect()
        client.loop_stop()


def farm_action(site: str | None) -> Probe:
    """`ha_get_status`, for `site` when given; right when it failed as expected where it was meant to run."""

    def make(request_id: str) -> dict[str, Any]:
        request: dict[str, Any] = {"type": "farm_action", "requestId": request_id, "action": ACTION, "params": {}}
        if site is not None:
            request["site"] = site
        return request

    def right(document: dict[str, Any]) -> bool:
        error = str(document.get("error") or "")
        # The origin prefixes another site's error with `site <name>: `; its own answer has no prefix.
        where = error.split(":", 1)[0][len("site ") :] if error.startswith("site ") else None
        return document.get("errorCode") == EXPECTED_CODE and where == site

    return Probe(make=make, right=right)


# ---------------------------------------------------------------------------------------------------------------
# The run


@contextlib.contextmanager
def sites_up(
    root: Path, report: Report, *, nodelay: bool
) -> Iterator[tuple[Mosquitto, FarmhostDaemon, FarmhostDaemon]]:
    """The broker and the two daemons on fresh data dirs, both online at the broker; all stopped afterwards."""
    log(f"creating the data dirs ({GROUPS_PER_SITE} groups each) with `farmhost group add` under {root}")
    template = make_data_dir(root / "template", GROUPS_PER_SITE)
    dirs = {}
    for site in (SITE_A, SITE_B):
        shutil.copytree(template, root / site / "data", symlinks=True)
        dirs[site] = root / site / "data"
    with contextlib.ExitStack() as stack:
        broker = Mosquitto(root, nodelay=nodelay)
        stack.callback(broker.stop)
        daemons = []
        for site in (SITE_A, SITE_B):
            log(f"starting farmhost for site {site} on {broker.url}")
            other = SITE_B if site == SITE_A else SITE_A  # each serves the other's calls (docs/mqtt.md)
            daemon = FarmhostDaemon(
                dirs[site], FARMHOST_MQTT_URL=broker.url, FARMHOST_SITE=site, FARMHOST_SITES_TRUSTED=other
            )
            stack.callback(daemon.stop)
            daemons.append(daemon)
        started = time.perf_counter()
        wait_online(broker.port, {SITE_A, SITE_B}, ONLINE_TIMEOUT_S)
        report.online_after_s = round(time.perf_counter() - started, 3)
        yield broker, daemons[0], daemons[1]


def measure_sequential(a: FarmhostDaemon, plan: Plan, report: Report) -> None:
    """Ping, local farm action and cross-site farm action from A's main group, in turn."""
    kinds = {
        "ping": PING,
        "local": farm_action(None),
        "cross-site": farm_action(SITE_B),
    }
    pingers = {name: Pinger(a.group_dir(0), fsync=False, probe=probe) for name, probe in kinds.items()}
    try:
        first = pingers["cross-site"].ping()
        if first is None:
            raise RuntimeError(f"no answer to the first call from {SITE_A} to {SITE_B}")
        report.first_call_ms = round(first[0], 2)
        log(f"first call {SITE_A} -> {SITE_B}: {first[0]:.1f} ms ({'right' if first[1] else 'WRONG'} answer)")
        log(f"sequential: {plan.n} of each (+{plan.warmup} warm-up), in turn: {', '.join(kinds)}")
        figures = interleaved(list(pingers.values()), n=plan.n, warmup=plan.warmup, gap=lambda: GAP_S)
    finally:
        for pinger in pingers.values():
            pinger.close()
    report.sequential = dict(zip(kinds, figures, strict=True))
    for name, pinger in pingers.items():
        host = sorted(a.processing_ms(plan.n, request_prefix=pinger.prefix))
        report.host_p50_ms[name] = percentile(host, 0.5)
    local, remote = report.sequential["local"], report.sequential["cross-site"]
    report.overhead_ms = {"p50": remote.p50_ms - local.p50_ms, "p99": remote.p99_ms - local.p99_ms}


def measure_streams(broker: Mosquitto, a: FarmhostDaemon, b: FarmhostDaemon, plan: Plan, report: Report,
                    window: int) -> None:  # fmt: skip
    """The three 8-stream runs, one after another on the same daemons."""
    main_a, main_b = a.group_dir(0), b.group_dir(0)
    runs: dict[str, list[tuple[str, Probe]]] = {
        "cross-site": [(main_a, farm_action(SITE_B))] * STREAMS_PER_SITE
        + [(main_b, farm_action(SITE_A))] * STREAMS_PER_SITE,
        "local farm action": [(main_a, farm_action(None))] * STREAMS_PER_SITE
        + [(main_b, farm_action(None))] * STREAMS_PER_SITE,
        "local ping, 8 groups": [(host.group_dir(i), PING) for host in (a, b) for i in range(GROUPS_PER_SITE)],
    }
    for name, lanes in runs.items():
        log(f"{name}: {len(lanes)} streams, window {window}, {plan.load_seconds:g} s")
        report.loads[name] = streams(
            lanes, [a.pid, b.pid, broker.pid], window=window, seconds=plan.load_seconds, ramp=plan.ramp_seconds,
            fsync=False,
        )  # fmt: skip


# farmhost's log lines at WARNING and above, tracebacks, and the broker's complaints (`<epoch>: ... error ...`).
_NOTEWORTHY = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) |Traceback|^\d+: .*\b([Ee]rror|[Ww]arning)\b")


def log_notes(paths: dict[str, Path], most: int = 5) -> list[str]:
    """Warnings and errors in the logs (`name: line`), at most `most` per log, then a count of the rest."""
    notes: list[str] = []
    for name, path in paths.items():
        with contextlib.suppress(FileNotFoundError):
            lines = [line for line in path.read_text(errors="replace").splitlines() if _NOTEWORTHY.search(line)]
            notes += [f"{name}: {line}" for line in lines[:most]]
            if len(lines) > most:
                notes.append(f"{name}: ... and {len(lines) - most} more")
    return notes


def run(plan: Plan, *, bench_dir: Path, window: int, broker_nodelay: bool, keep: bool) -> Report:
    """Start the broker and the sites, measure, and return the report."""
    wall = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="farmhost-sites-bench-", dir=bench_dir))
    report = Report(
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine={**machine_info(root), "mosquitto": mosquitto_version()},
        options={
            "plan": asdict(plan),
            "window": window,
            "gap_ms": GAP_S * 1000,
            "action": ACTION,
            "broker_nodelay": broker_nodelay,
        },
        sites={"A": SITE_A, "B": SITE_B},
    )
    try:
        with sites_up(root, report, nodelay=broker_nodelay) as (broker, a, b):
            log(f"both sites online at the broker {report.online_after_s:.2f} s after their daemons were alive")
            measure_sequential(a, plan, report)
            measure_streams(broker, a, b, plan, report, window)
            logs = {SITE_A: a.log_path, SITE_B: b.log_path}
        report.log_notes = log_notes({**logs, "mosquitto": root / "mosquitto.log"})
    finally:
        if keep:
            log(f"data dirs and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report.machine["loadavg_at_end"] = os.getloadavg()[0]
    report.machine["at_end"] = file_costs(bench_dir)
    report.wall_seconds = round(time.perf_counter() - wall, 1)
    return report


# ---------------------------------------------------------------------------------------------------------------
# Output


Cell = float | int | str | None


def _cell(value: Cell, width: int) -> str:
    if value is None or isinstance(value, str):
        return f"{value or '':>{width}}"
    if isinstance(value, int):
        return f"{value:>{width},}"
    return f"{value:>{width}.2f}"


def _header(title: str, width: int, head: list[str], widths: list[int]) -> list[str]:
    columns = f"{'':<{width}}" + "".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True))
    return [title, columns, "-" * len(columns)]


def _row(label: str, width: int, values: list[Cell], widths: list[int]) -> str:
    return f"{label:<{width}}" + "".join(_cell(v, w) for v, w in zip(values, widths, strict=True))


def render(report: Report) -> str:
    """The two tables and the machine."""
    a, b = SITE_A, SITE_B
    opts = report.options
    labels = {
        "ping": f"ping at {a} (the raw IPC floor)",
        "local": f"{ACTION} at {a}, local (baseline)",
        "cross-site": f"{ACTION} {a} -> {b} (cross-site)",
    }
    width = max(len(label) for label in labels.values()) + 2
    seq_widths = [6, 8, 8, 8, 8, 8, 10, 7]
    head = ["n", "p50", "p95", "p99", "max", "mean", "host p50", "wrong"]
    title = f"Sequential round trips from {a}'s main group, in turn, {opts['gap_ms']:g} ms apart (ms)"
    lines = _header(title, width, head, seq_widths)
    for key, label in labels.items():
        lat = report.sequential[key]
        values: list[Cell] = [lat.n, lat.p50_ms, lat.p95_ms, lat.p99_ms, lat.max_ms, lat.mean_ms]
        lines.append(_row(label, width, [*values, report.host_p50_ms.get(key), lat.errors], seq_widths))
    over = report.overhead_ms
    lines.append(_row("cross-site overhead (b - a)", width, [None, over["p50"], None, over["p99"]], seq_widths[:4]))
    lines.append(
        f"first cross-site call once both sites were online: {report.first_call_ms:.1f} ms; the broker held both "
        f"`online` {report.online_after_s:.2f} s after the daemons were alive"
    )
    plan = opts["plan"]
    load_widths = [9, 9, 9, 22, 14, 7, 6]
    load_head = ["calls/s", "p50", "p99", "CPU % A / B / broker", "client CPU %", "wrong", "lost"]
    load_labels = {
        "cross-site": f"cross-site: 4 {a} -> {b} + 4 {b} -> {a}",
        "local farm action": f"local {ACTION}: 4 in each main group",
        "local ping, 8 groups": "local ping: 8 groups, 4 per site",
    }
    lwidth = max(len(label) for label in load_labels.values()) + 2
    title = (
        f"8 streams at once, each {opts['window']} request(s) outstanding, {plan['load_seconds']:g} s counted after a "
        f"{plan['ramp_seconds']:g} s ramp (latency in ms)"
    )
    lines += ["", *_header(title, lwidth, load_head, load_widths)]
    for key, label in load_labels.items():
        t = report.loads[key]
        cpu = " / ".join(f"{pct:.0f}" for pct in t.host_cpu_pct_each)
        figures: list[Cell] = [t.requests_per_s, t.p50_ms, t.p99_ms, cpu, t.client_cpu_pct]
        lines.append(_row(label, lwidth, [*figures, t.errors, t.lost], load_widths))
    m = report.machine
    nodelay = "set_tcp_nodelay true" if opts["broker_nodelay"] else "default TCP options (Nagle on)"
    lines += [
        "",
        *machine_lines(report.date, m, report.wall_seconds),
        (
            f"broker: mosquitto {m['mosquitto']} on 127.0.0.1, {nodelay}; host p50: site A's own durationMs "
            "(logs/requests.ndjson); wrong: an answer other than the expected one"
        ),
        *(
            ["warnings and errors in the logs:", *(f"  {note}" for note in report.log_notes)]
            if report.log_notes
            else ["no warning or error in the daemons' and the broker's logs"]
        ),
        *busy_note(m),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse options, run, print the tables (and JSON); always 0 unless the benchmark could not run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="fewer samples and shorter windows: ~25 s instead of ~70 s"
    )
    add_output_options(parser)
    parser.add_argument("--window", type=int, default=1, help="requests each stream keeps outstanding (default 1)")
    parser.add_argument("--broker-nodelay", action="store_true",
                        help="`set_tcp_nodelay true` in the broker's config (mosquitto's default is Nagle on)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and the logs afterwards")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    def measure() -> Report:
        return run(plan, bench_dir=args.dir, window=args.window, broker_nodelay=args.broker_nodelay, keep=args.keep)

    return report_run("sites_roundtrip", measure, render, args.json)


if __name__ == "__main__":
    sys.exit(main())
