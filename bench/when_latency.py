"""Farm events wake the agent: how long from a Home Assistant state change to the `when` task's run start.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/when_latency.py            # 15 crossings x 4 tasks, about 2 min
    .venv/bin/python bench/when_latency.py --quick    # 5 crossings x 2 tasks

A fresh local Home Assistant (the test harness's farm) and the real daemon (`farmhost run`, agent kind `command`
in bubblewrap: a program that answers at once). `when` tasks wait for the field 1 soil moisture sensor to drop
below 25 % (cooldown 5 s, the minimum); the bench drives its input_number helper across the threshold and back.
Measured per crossing and task: from HA's `last_changed` of the crossing to the run's claim (`task_runs.claimed_at`,
the moment the run starts; goal, issue 34: p99 <= 1.5 s).

Baseline, in the same daemon: the clock path, `once` tasks from their due time to their claim. Before `when`, an
agent learnt of a crossing only from a cron task that happened to look: a look every N minutes is N/2 late on
average, printed for N = 15 beside the figures.

Reports; never gates.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sqlite3
import sys
import tempfile
import time
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from farmhost.localha.instance import HaInstance, start_session_instance
from farmhost_dev.testing import Daemon, clean_env, drop, init_data_dir, wait_for, wait_result

SOIL = "sensor.field_1_soil_moisture"
COOLDOWN = 5  # the minimum cooldown (scheduler/when.py MIN_COOLDOWN): crossings as often as a task allows
CRON_LOOK_MINUTES = 15  # the baseline agent's cron look
ECHO = (
    "import json, sys; p = json.load(sys.stdin)['prompt']; "
    "print(json.dumps({'status': 'ok', 'answer': p[:80], 'error': None, 'turns': 1, 'toolCalls': 0}))"
)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def rows(data_dir: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    """Rows of the daemon's database, on a connection of our own."""
    with closing(sqlite3.connect(data_dir / "farmhost.db")) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, args).fetchall())


def schedule(data_dir: Path, rid: str, schedule_type: str, value: object) -> str:
    """Create a task in main; its id."""
    payload = {"type": "schedule_task", "requestId": rid, "prompt": "bench", "schedule_type": schedule_type,
               "schedule_value": value}  # fmt: skip
    drop(data_dir, "main", "tasks", payload)
    result = wait_result(data_dir, "main", rid, timeout=20)
    assert result["status"] == "success", result
    task_id: str = result["result"]["taskId"]
    return task_id


def claims(data_dir: Path, task_ids: list[str]) -> list[sqlite3.Row]:
    """The claimed (run) rows of the tasks."""
    marks = ",".join("?" * len(task_ids))
    sql = f"SELECT * FROM task_runs WHERE task_id IN ({marks}) AND status != 'skipped'"
    return rows(data_dir, sql, *task_ids)


def when_latencies(ha: HaInstance, data_dir: Path, crossings: int, tasks: int) -> list[float]:
    """Seconds from each crossing's HA last_changed to each task's claim."""
    ids = [schedule(data_dir, f"when-{i}", "when", {"entity": SOIL, "below": 25, "cooldown": COOLDOWN})
           for i in range(tasks)]  # fmt: skip
    wait_for(lambda: len(rows(data_dir, "SELECT * FROM when_state")) >= tasks, timeout=20, what="the tasks' first look")
    latencies: list[float] = []
    for n in range(crossings):
        ha.set_state(SOIL, 40)
        ha.set_state(SOIL, 20)
        changed = datetime.fromisoformat(ha.get_state(SOIL)["last_changed"])
        got = wait_for(
            lambda n=n: c if len(c := claims(data_dir, ids)) >= (n + 1) * tasks else None,  # type: ignore[misc]
            timeout=30,
            what=f"the runs of crossing {n + 1}",
        )
        for row in got:
            claimed = datetime.fromisoformat(row["claimed_at"])
            if claimed >= changed:
                latencies.append((claimed - changed).total_seconds())
        time.sleep(COOLDOWN + 0.2)  # the bench's pacing, not a wait for a condition: the cooldown must pass
    return latencies


def once_latencies(data_dir: Path, count: int) -> list[float]:
    """Seconds from `once` tasks' due times to their claims (the clock path)."""
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    ids = [schedule(data_dir, f"once-{i}", "once", (start + timedelta(seconds=i)).isoformat()) for i in range(count)]
    got = wait_for(
        lambda: c if len(c := claims(data_dir, ids)) == count else None, timeout=count + 30, what="the once runs"
    )
    return [
        (datetime.fromisoformat(r["claimed_at"]) - datetime.fromisoformat(r["due_at"])).total_seconds() for r in got
    ]


def line(label: str, values: list[float]) -> str:
    """One result line, in ms."""
    ms = [v * 1000 for v in values]
    return (
        f"{label:<34} n={len(ms):<4} p50={percentile(ms, 50):7.1f} ms  p99={percentile(ms, 99):7.1f} ms  "
        f"max={max(ms):7.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 crossings x 2 tasks")
    parser.add_argument("--crossings", type=int, default=15)
    parser.add_argument("--tasks", type=int, default=4)
    args = parser.parse_args(argv)
    crossings, tasks = (5, 2) if args.quick else (args.crossings, args.tasks)
    with tempfile.TemporaryDirectory(prefix="farmhost-when-bench-") as tmp:
        root = Path(tmp)
        ha = start_session_instance(root / "ha", log=lambda m: print(f"[ha] {m}", file=sys.stderr))
        try:
            data_dir = init_data_dir(root / "data")
            env = clean_env(
                **ha.env(),
                FARMHOST_AGENT_RUNTIME="bwrap",
                FARMHOST_AGENT_KIND="command",
                FARMHOST_AGENT_COMMAND=shlex.join([sys.executable, "-c", ECHO]),
            )
            daemon = Daemon(data_dir, env=env).start(timeout=30)
            try:
                when = when_latencies(ha, data_dir, crossings, tasks)
                once = once_latencies(data_dir, 10)
            finally:
                daemon.stop()
        finally:
            ha.stop()
    print(line("when: HA change -> run start", when))
    print(line("baseline once: due -> run start", once))
    print(f"{'baseline cron look every 15 min':<34} mean delay {CRON_LOOK_MINUTES * 60 / 2:7.0f} s")
    goal = percentile([v * 1000 for v in when], 99) <= 1500
    print(json.dumps({"whenP99Ms": round(percentile(when, 99) * 1000, 1), "goalP99Ms": 1500, "met": goal}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
