"""A SIGTERM while a group's first memory index is being built: the daemon ends the builder and stops cleanly."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

from farmhost_testing import Daemon, drop, scaled, wait_for

# The contract's bound for a clean stop (SPEC section 7).
STOP_BOUND_SECONDS = 10.0
BUILDER = "farmhost.memory.indexer"


def _big_memory(workspace: Path, files: int, size: int) -> None:
    """`files` notes of `size` bytes of varied words: a first index that takes the builder process seconds."""
    notes = workspace / "memory" / "big"
    notes.mkdir(parents=True)
    rng = random.Random(1)
    words = [f"w{n}" for n in range(20_000)] + ["tomato", "irrigation", "pump", "frost"]
    for n in range(files):
        lines, total = [], 0
        while total < size:
            line = f"## heading {n} {total}" if rng.random() < 0.05 else " ".join(rng.choices(words, k=12))
            lines.append(line)
            total += len(line) + 1
        (notes / f"f{n:04d}.md").write_text("\n".join(lines), encoding="utf-8")


def _builders(data_dir: Path) -> list[int]:
    """The pids of the memory builder processes working on this data directory."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if BUILDER.encode() in argv and any(str(data_dir).encode() in arg for arg in argv):
            pids.append(int(proc.name))
    return pids


def test_sigterm_during_a_first_index_build_stops_cleanly_within_the_contracts_bound(data_dir: Path) -> None:
    _big_memory(data_dir / "groups" / "field", files=200, size=100_000)
    daemon = Daemon(data_dir).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    drop(data_dir, "field", "actions", {"type": "memory_action", "action": "memory_search",
                                        "params": {"query": "tomato", "topK": 2}, "requestId": "big-1"})  # fmt: skip
    wait_for(lambda: _builders(data_dir), timeout=30, interval=0.05, what="the memory builder process to start")

    began = time.monotonic()
    code = daemon.stop(signal.SIGTERM, timeout=STOP_BOUND_SECONDS)
    stopped_after = time.monotonic() - began

    log = daemon.log()
    assert code == 0, log[-3000:]
    assert stopped_after < scaled(STOP_BOUND_SECONDS), (stopped_after, log[-3000:])
    assert "Traceback" not in log, log[-3000:]
    for folder in ("main", "field"):
        status = json.loads((data_dir / "ipc" / folder / "host_status.json").read_text())
        assert status["status"] == "stopped" and status["pid"] == pid
    assert _builders(data_dir) == [], "the builder process is ended with the daemon, not left behind"
    assert "farmhost stopped" in log
