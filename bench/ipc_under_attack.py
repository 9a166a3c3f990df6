"""The IPC engine under attack: main's ping and the daemon's event-loop lag while other groups attack, side by side.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/ipc_under_attack.py              # every scenario, about 2 minutes
    .venv/bin/python bench/ipc_under_attack.py --quick      # ~40 s smoke run, too short to quote
    .venv/bin/python bench/ipc_under_attack.py --json out.json

Every scenario gets a fresh copy of one data dir with 16 groups (g00 is main, added with ``farmhost group add``)
and a fresh ``python -m farmhost run``. Main's agent side sends pings one at a time (3 ms apart, as between an
agent's tool calls) for the whole window while attacker processes, one per attacking group, do what an agent of
that group could do on purpose:

- ``baseline``: nothing; the figures every other row is compared with;
- ``crons``: 6 groups each keep 3 ``schedule_task`` requests with a cron that never fires outstanding;
- ``files``: 2 groups each keep one 40 MiB ``file`` message outstanding (the host copies it into its outbox, until
  the group's share of unsent files is full; then they are refused ``rate_limited``);
- ``files-unshared``: the same with a share large enough that every file is copied (the disk's own limit);
- ``churn``: 15 groups schedule and cancel tasks in a loop, so main's ``current_tasks.json`` changes constantly;
- ``swap``: 2 groups swap their ``actions/`` for a link to main's and back in a tight loop (the attack of issue 12);
- ``all``: all of the above at once, on separate groups.

The loop lag is the daemon's own measurement (``logs/loop_lag.json``: how long each turn of the loop kept what
became ready waiting; until 2026-12-06 a 10 ms sleep and how late it woke),
counted over the window only. The script reports and never gates: it exits 0 whatever the figures, 2 when it
could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from roundtrip_client import Pinger, ResultWaiter, percentile, write_request
from roundtrip_hosts import FarmhostDaemon, chat_jid, cpu_seconds, folder_name, make_data_dir
from roundtrip_machine import machine_info

TARGET_P99_MS = 20.0
TARGET_LAG_MAX_MS = 50.0
GROUPS = 16
GAP_S = 0.003
PING_TIMEOUT_S = 10.0  # a ping not answered by then counts as lost (and the wait as its latency)
ATTACK_WAIT_S = 60.0  # an attacker's batch not answered by then is abandoned and counted
NEVER_FIRES = "0 0 31 2,4,6,9,11 *"  # the 31st of months that have 30 days or fewer
FILE_MB = 40
WARMUP_PINGS = 200
VICTIM = 15  # a non-main group that attacks nobody: its agent sends a ping every VICTIM_GAP_S
VICTIM_GAP_S = 0.05


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Attackers: each runs in its own process, as an agent does, until `stop` is set, and reports what it did.


def _batches(group_dir: str, queue: str, make: Callable[[str], dict[str, Any]], size: int, stop: EventType,
             tag: str) -> dict[str, Any]:  # fmt: skip
    """Keep `size` requests of one kind outstanding in `queue`: write them, wait for all results, repeat."""
    waiter = ResultWaiter(os.path.join(group_dir, "action_results"))
    queue_dir = os.path.join(group_dir, queue)
    done = abandoned = 0
    codes: dict[str, int] = {}
    serial = 0
    try:
        while not stop.is_set():
            names = set()
            for _ in range(size):
                request_id = f"{tag}-{os.getpid()}-{serial:06d}"
                serial += 1
                write_request(queue_dir, request_id, {**make(request_id), "requestId": request_id}, fsync=False)
                names.add(f"{request_id}.json")
            deadline = time.perf_counter() + ATTACK_WAIT_S
            while names and time.perf_counter() < deadline:
                for name in waiter.arrived(names, deadline=deadline):
                    path = os.path.join(group_dir, "action_results", name)
                    with open(path, "rb") as handle:
                        result = json.loads(handle.read())
                    os.unlink(path)
                    code = result.get("errorCode") or result.get("status")
                    codes[code] = codes.get(code, 0) + 1
                    names.discard(name)
                    done += 1
            abandoned += len(names)
    finally:
        waiter.close()
    return {"answered": done, "abandoned": abandoned, "codes": codes}


def attack_crons(group_dir: str, stop: EventType) -> dict[str, Any]:
    """Never-firing crons, three at a time."""

    def cron(_: str) -> dict[str, Any]:
        return {"type": "schedule_task", "prompt": "p", "schedule_type": "cron", "schedule_value": NEVER_FIRES}

    return _batches(group_dir, "tasks", cron, 3, stop, "cron")


def attack_files(group_dir: str, stop: EventType) -> dict[str, Any]:
    """A 40 MiB file from the group's workspace, sent to the group's own chat, one at a time."""
    chat = chat_jid(int(os.path.basename(group_dir)[1:]))

    def file_message(_: str) -> dict[str, Any]:
        return {"type": "file", "chatJid": chat, "path": "harvest.bin"}

    return _batches(group_dir, "messages", file_message, 1, stop, "file")


def attack_churn(group_dir: str, stop: EventType) -> dict[str, Any]:
    """Schedule a task and cancel it, over and over: every change is a new view for main's snapshot."""
    waiter = ResultWaiter(os.path.join(group_dir, "action_results"))
    tasks = os.path.join(group_dir, "tasks")
    changes = failed = 0

    def answer(request_id: str) -> dict[str, Any] | None:
        name = f"{request_id}.json"
        if not waiter.arrived((name,), deadline=time.perf_counter() + ATTACK_WAIT_S):
            return None
        path = os.path.join(group_dir, "action_results", name)
        with open(path, "rb") as handle:
            result: dict[str, Any] = json.loads(handle.read())
        os.unlink(path)
        return result

    try:
        while not stop.is_set():
            task_id = f"churn-{os.getpid()}-{changes:06d}"
            schedule = {"type": "schedule_task", "prompt": "p", "schedule_type": "interval"}
            request = {**schedule, "schedule_value": "3600000", "taskId": task_id, "requestId": f"{task_id}-s"}
            write_request(tasks, request["requestId"], request, fsync=False)
            scheduled = answer(request["requestId"])
            cancel = {"type": "cancel_task", "taskId": task_id, "requestId": f"{task_id}-c"}
            write_request(tasks, cancel["requestId"], cancel, fsync=False)
            cancelled = answer(cancel["requestId"])
            ok = all(r is not None and r.get("status") == "success" for r in (scheduled, cancelled))
            changes += 2 if ok else 0
            failed += not ok
    finally:
        waiter.close()
    return {"changes": changes, "failed": failed}


def attack_swap(group_dir: str, stop: EventType) -> dict[str, Any]:
    """Swap `actions/` for a link to main's queue and back, links living 0-6 ms (long enough for the host to act)."""
    actions, parked = os.path.join(group_dir, "actions"), os.path.join(group_dir, "actions.real")
    rounds = 0

    def settle() -> None:
        # Put the real directory back at `actions`, whatever the host did meanwhile (it recreates what is missing).
        if not os.path.isdir(parked):
            return
        if os.path.islink(actions):
            os.unlink(actions)
        if os.path.isdir(actions):
            for name in os.listdir(actions):
                os.rename(os.path.join(actions, name), os.path.join(parked, name))
            os.rmdir(actions)
        os.rename(parked, actions)

    while not stop.is_set():
        with contextlib.suppress(OSError):
            settle()
            os.rename(actions, parked)
            os.symlink(f"../{folder_name(0)}/actions", actions)
            time.sleep((rounds % 7) / 1000)
            os.unlink(actions)
            os.rename(parked, actions)
        rounds += 1
    for _ in range(100):
        with contextlib.suppress(OSError):
            settle()
            break
    return {"rounds": rounds}


ATTACKS: dict[str, Callable[[str, EventType], dict[str, Any]]] = {
    "crons": attack_crons,
    "files": attack_files,
    "churn": attack_churn,
    "swap": attack_swap,
}
# Which groups (by index) run which attack, per scenario; g00 is main and is never an attacker.
SCENARIOS: dict[str, dict[str, range]] = {
    "baseline": {},
    "crons": {"crons": range(1, 7)},
    "files": {"files": range(1, 3)},
    "files-unshared": {"files": range(1, 3)},
    "churn": {"churn": range(1, VICTIM)},
    "swap": {"swap": range(1, 3)},
    "all": {"crons": range(1, 4), "files": range(4, 5), "churn": range(5, 13), "swap": range(13, 15)},
}


def _attacker_main(attack: str, group_dir: str, stop: EventType, out: Any) -> None:
    try:
        report = ATTACKS[attack](group_dir, stop)
    except (OSError, ValueError) as err:  # reported, not raised: one broken attacker must not hang the run
        report = {"error": f"{type(err).__name__}: {err}"}
    out.put((attack, group_dir, report))


# ---------------------------------------------------------------------------------------------------------------
# Measuring one scenario


@dataclass
class Row:
    """What main and the daemon saw during one scenario's window."""

    scenario: str
    pings: int = 0
    lost: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    victim_pings: int = 0
    victim_lost: int = 0
    victim_p50_ms: float = 0.0
    victim_p99_ms: float = 0.0
    lag_p99_ms: float = 0.0  # upper edge of the histogram bucket holding the 99th percentile
    lag_max_ms: float = 0.0
    lag_samples: int = 0
    host_cpu_pct: float = 0.0
    attacks: dict[str, Any] = field(default_factory=dict)


def _lag_document(data_dir: Path) -> dict[str, Any] | None:
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        document: dict[str, Any] = json.loads((data_dir / "logs" / "loop_lag.json").read_bytes())
        return document
    return None


def _fresh_lag(data_dir: Path, after: float) -> dict[str, Any]:
    """The first loop-lag document written after wall time `after` (the daemon writes one every second)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        document = _lag_document(data_dir)
        if document is not None and document["updatedAt"] > after:
            return document
        time.sleep(0.05)
    raise RuntimeError("the daemon wrote no logs/loop_lag.json for 30 s")


class LagWatch:
    """Every loop-lag document of a window, so the worst interval is seen, and the histogram's difference."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir
        self.first = _fresh_lag(data_dir, time.time())
        self._seen: dict[float, float] = {}

    def follow(self, stop: threading.Event) -> None:
        """Note every document's interval maximum until `stop` is set (the daemon writes one a second)."""
        while not stop.wait(0.2):
            document = _lag_document(self._data_dir)
            if document is not None and document["updatedAt"] > self.first["updatedAt"]:
                self._seen[document["updatedAt"]] = document["intervalMaxMs"]

    def finish(self, row: Row) -> None:
        """Wait for the document that covers the window's end; fill the row's lag figures."""
        last = _fresh_lag(self._data_dir, time.time())
        self._seen[last["updatedAt"]] = last["intervalMaxMs"]
        counts = [b - a for a, b in zip(self.first["counts"], last["counts"], strict=True)]
        edges = [*last["bucketEdgesMs"], float("inf")]
        total, running = sum(counts), 0
        row.lag_samples = total
        for edge, count in zip(edges, counts, strict=True):
            running += count
            if running >= 0.99 * total:
                row.lag_p99_ms = edge
                break
        # The last interval may reach past the window by up to a second: an overestimate, never an underestimate.
        row.lag_max_ms = max(self._seen.values(), default=0.0)


def _write_harvest(data_dir: Path, index: int) -> None:
    """The 40 MiB file the file attacker of group `index` sends from its workspace."""
    with open(data_dir / "groups" / folder_name(index) / "harvest.bin", "wb") as out:
        out.writelines(os.urandom(1024 * 1024) for _ in range(FILE_MB))


@contextlib.contextmanager
def _attackers(data_dir: Path, plan: dict[str, range], reports: dict[str, list[dict[str, Any]]]) -> Iterator[None]:
    context = mp.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    procs = []
    for attack, indexes in plan.items():
        for index in indexes:
            group_dir = str(data_dir / "ipc" / folder_name(index))
            proc = context.Process(target=_attacker_main, args=(attack, group_dir, stop, out), daemon=True)
            proc.start()
            procs.append(proc)
    try:
        yield
    finally:
        stop.set()
        for _ in procs:
            try:
                attack, group_dir, report = out.get(timeout=ATTACK_WAIT_S + 30)
            except queue.Empty:  # an attacker that never reported: counted below as missing
                break
            reports.setdefault(attack, []).append(report)
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _summary(reports: dict[str, list[dict[str, Any]]], plan: dict[str, range]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for attack, indexes in plan.items():
        got = reports.get(attack, [])
        totals: dict[str, Any] = {"groups": len(indexes), "reported": len(got)}
        for report in got:
            for key, value in report.items():
                if isinstance(value, int):
                    totals[key] = totals.get(key, 0) + value
                elif isinstance(value, dict):
                    merged = totals.setdefault(key, {})
                    for code, count in value.items():
                        merged[code] = merged.get(code, 0) + count
                else:
                    totals.setdefault("errors", []).append(value)
        summary[attack] = totals
    return summary


def _pings_until(pinger: Pinger, stop: threading.Event, gap: float) -> tuple[list[float], int]:
    """Ping until `stop` is set; a lost ping counts PING_TIMEOUT_S. Returns (sorted samples, lost)."""
    samples: list[float] = []
    lost = 0
    while not stop.is_set():
        answer = pinger.ping(timeout=PING_TIMEOUT_S)
        lost += answer is None
        samples.append(PING_TIMEOUT_S * 1000 if answer is None else answer[0])
        stop.wait(gap)
    return sorted(samples), lost


def measure(name: str, template: Path, root: Path, seconds: float) -> Row:
    """One scenario on a fresh copy of the data dir and a fresh daemon."""
    plan = SCENARIOS[name]
    data_dir = root / name / "data"
    shutil.copytree(template, data_dir, symlinks=True)
    for index in plan.get("files", range(0)):
        _write_harvest(data_dir, index)
    row = Row(scenario=name)
    settings = {"FARMHOST_OUTBOX_GROUP_MAX_BYTES": str(2**40)} if name == "files-unshared" else {}
    daemon = FarmhostDaemon(data_dir, **settings)
    reports: dict[str, list[dict[str, Any]]] = {}
    main, victim = Pinger(daemon.group_dir(0), fsync=False), Pinger(daemon.group_dir(VICTIM), fsync=False)
    try:
        for _ in range(WARMUP_PINGS):
            if main.ping() is None or (_ % 20 == 0 and victim.ping() is None):
                raise RuntimeError("a warm-up ping was not answered")
            time.sleep(GAP_S)
        with _attackers(data_dir, plan, reports), ThreadPoolExecutor(2) as pool:
            time.sleep(0.5 if plan else 0)  # the attackers' interpreters start (spawn) before the window
            lag = LagWatch(data_dir)
            stop = threading.Event()
            victim_run = pool.submit(_pings_until, victim, stop, VICTIM_GAP_S)
            pool.submit(lag.follow, stop)
            cpu_before, started = cpu_seconds(daemon.pid), time.perf_counter()
            timer = threading.Timer(seconds, stop.set)
            timer.start()
            try:
                samples, row.lost = _pings_until(main, stop, GAP_S)
            finally:
                stop.set()
                timer.cancel()
            row.host_cpu_pct = 100 * (cpu_seconds(daemon.pid) - cpu_before) / (time.perf_counter() - started)
            victim_samples, row.victim_lost = victim_run.result()
            lag.finish(row)
    finally:
        main.close()
        victim.close()
        daemon.stop()
    row.pings, row.p50_ms, row.p99_ms = len(samples), percentile(samples, 0.5), percentile(samples, 0.99)
    row.max_ms = samples[-1]
    row.victim_pings = len(victim_samples)
    row.victim_p50_ms, row.victim_p99_ms = percentile(victim_samples, 0.5), percentile(victim_samples, 0.99)
    row.attacks = _summary(reports, plan)
    return row


# ---------------------------------------------------------------------------------------------------------------
# Report


def verdict(row: Row) -> str:
    """PASS when main's ping p99 and the loop's worst lag are within the issue's targets and no ping was lost."""
    ok = row.lost == row.victim_lost == 0 and row.p99_ms <= TARGET_P99_MS and row.lag_max_ms <= TARGET_LAG_MAX_MS
    return "PASS" if ok else "FAIL"


def _attack_note(row: Row) -> str:
    notes = []
    for attack, totals in row.attacks.items():
        if attack == "swap":
            notes.append(f"swap {totals.get('rounds', 0):,} rounds")
        elif attack == "churn":
            notes.append(f"churn {totals.get('changes', 0):,} changes ({totals.get('failed', 0)} failed)")
        else:
            codes = ", ".join(f"{code} {count:,}" for code, count in sorted(totals.get("codes", {}).items()))
            notes.append(f"{attack}: {codes or 'none answered'}, abandoned {totals.get('abandoned', 0)}")
        if totals.get("reported") != totals.get("groups") or totals.get("errors"):
            notes.append(
                f"{attack} attackers reported {totals.get('reported')}/{totals['groups']} {totals.get('errors', '')}"
            )
    return "; ".join(notes)


def render(rows: list[Row]) -> str:
    """The table: one row per scenario, baseline first."""
    head = f"{'scenario':<14} {'pings':>6} {'lost':>4} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
    head += f"{'light p50':>9} {'light p99':>9} {'lag p99':>8} {'lag max':>8} {'host CPU':>8}  verdict  attack"
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(
            f"{row.scenario:<14} {row.pings:>6} {row.lost:>4} {row.p50_ms:>7.2f} {row.p99_ms:>7.2f} {row.max_ms:>7.1f} "
            f"{row.victim_p50_ms:>9.2f} {row.victim_p99_ms:>9.2f} "
            f"{'≤' + format(row.lag_p99_ms, 'g'):>8} {row.lag_max_ms:>8.1f} {row.host_cpu_pct:>7.0f}%  "
            f"{verdict(row) if row.scenario != 'baseline' else '  -  ':<7}  {_attack_note(row)}"
        )
    lines.append(
        f"targets under attack: ping p99 ≤ {TARGET_P99_MS:g} ms, loop lag max ≤ {TARGET_LAG_MAX_MS:g} ms, no ping lost"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run every scenario, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s windows instead of 15 s (a smoke run)")
    parser.add_argument("--seconds", type=float, help="length of each scenario's window")
    parser.add_argument("--only", action="append", choices=list(SCENARIOS), help="run only these (baseline always)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH ('-' for stdout)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the data dirs go")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs (and the daemons' logs) afterwards")
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 15.0)
    names = ["baseline", *[n for n in SCENARIOS if n != "baseline" and (not args.only or n in args.only)]]
    root = Path(tempfile.mkdtemp(prefix="farmhost-attack-", dir=args.dir))
    try:
        log(f"a data dir with {GROUPS} groups")
        template = make_data_dir(root / "template", GROUPS)
        rows = []
        for name in names:
            log(f"{name}: {seconds:g} s of main's pings")
            rows.append(measure(name, template, root, seconds))
            if not args.keep:
                shutil.rmtree(root / name, ignore_errors=True)
    except RuntimeError as err:
        print(f"cannot run the benchmark: {err}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            log(f"data dirs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    table = render(rows)
    document = {"machine": machine_info(args.dir), "seconds": seconds, "rows": [asdict(r) for r in rows]}
    if args.json == "-":
        print(table, file=sys.stderr)
        print(json.dumps(document, indent=2))
    else:
        print(table)
        if args.json:
            Path(args.json).write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
