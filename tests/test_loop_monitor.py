"""The daemon's event-loop monitor: a real stall of the real app's loop is logged and lands in loop_lag.json."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from farmhost_testing import clean_env, scaled

from farmhost.loop_monitor import LoopMonitor

# The real App in a child process; once it is up, something blocks its loop for 0.6 s (as a slow check on the loop
# would), then the probe waits (without blocking) for the monitor to have written the interval that saw it. It
# prints STALL (on the stream the log goes to) just before, so the test knows which warnings came before the stall.
PROBE = """
import asyncio, json, logging, sys, time
from pathlib import Path
from farmhost.app import App
from farmhost.config import Settings

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")

async def main() -> None:
    data = Path(sys.argv[1])
    app = App(Settings(_env_file=None, FARMHOST_DATA_DIR=data))
    await app.start()
    try:
        await asyncio.sleep(0.3)
        print("STALL", flush=True)
        time.sleep(0.6)
        path = data / "logs" / "loop_lag.json"
        for _ in range(int(float(sys.argv[2]) * 20)):
            await asyncio.sleep(0.05)
            if path.exists() and json.loads(path.read_bytes())["maxMs"] >= 500:
                break
    finally:
        await app.stop()

asyncio.run(main())
"""


def test_a_blocked_loop_is_logged_and_measured(data_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir), str(scaled(10))],
        capture_output=True, text=True, env=clean_env(), timeout=scaled(60), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "STALL" in lines, done.stdout
    stall = lines.index("STALL")
    warned = [
        (at, float(line.split("blocked for ")[1].split(" ms")[0]))
        for at, line in enumerate(lines)
        if "event loop blocked for" in line
    ]
    # The stall is logged: by a warning of its own, unless an incidental stall of a busy machine (at start, say)
    # warned just before and the warnings' rate limit (one per 10 s) folds this one in.
    assert warned, done.stdout
    assert all(ms >= 250 for _, ms in warned), done.stdout  # the threshold
    if not any(at < stall for at, _ in warned):
        after = [ms for at, ms in warned if at > stall]
        assert after and 550 <= after[0] < 5000, done.stdout
    figures = json.loads((data_dir / "logs" / "loop_lag.json").read_bytes())
    assert figures["maxMs"] >= 550
    assert figures["samples"] == sum(figures["counts"]) > 0
    assert len(figures["counts"]) == len(figures["bucketEdgesMs"]) + 1
    assert figures["counts"][-1] >= 0 and sum(figures["counts"][-3:]) >= 1  # the stall is in a slow bucket


async def test_an_idle_loop_is_not_woken_to_be_measured_and_a_stall_in_it_is_measured_whole(tmp_path: Path) -> None:
    monitor = LoopMonitor(tmp_path)
    monitor.start()
    try:
        await asyncio.sleep(0)  # the first turn under the monitor
        before = monitor.figures()["samples"]
        # The loop waits for a thread for a second with nothing else to do: it wakes when the thread is done and
        # perhaps once to write the figures (a monitor that ticked every 10 ms woke it 100 times meanwhile).
        await asyncio.to_thread(time.sleep, 1.0)
        waited = monitor.figures()
        time.sleep(0.4)  # noqa: ASYNC251 - a blocking call on the loop, on purpose
        await asyncio.sleep(0)
        figures = monitor.figures()
    finally:
        await monitor.stop()
    # The second of waiting is no turn: counted as one, it would be a turn of about 1000 ms. A loaded machine may
    # still make a turn of the wait slow (a wake taken late, a collection of the test process's garbage).
    assert waited["samples"] - before <= 5 and waited["maxMs"] < 750, waited
    slow = sum(figures["counts"][-4:]) - sum(waited["counts"][-4:])  # turns of 250 ms or more, since the wait
    assert figures["maxMs"] >= 400 and slow == 1, (waited, figures)  # one turn, the stall, all of it
