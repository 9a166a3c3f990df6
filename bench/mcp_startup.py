"""Start-up benchmark of `farmagent-mcp`: spawn -> `initialize` answered, and the import time of the server module.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/mcp_startup.py              # 10 spawns
    .venv/bin/python bench/mcp_startup.py --runs 30

Each run spawns ``python -m farmagent.mcp_server`` on a fresh temporary IPC directory (no host is needed to
answer ``initialize``), writes one JSON-RPC ``initialize`` line on its stdin and stops the clock when the
response line arrives: what an MCP client waits before it can list tools. The import of
``farmagent.mcp_server`` alone is timed in a fresh interpreter as well. The script reports; it never gates:
the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}


def spawn_to_initialize(env: dict[str, str]) -> float:
    """Seconds from spawning the server to reading its `initialize` response."""
    started = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-m", "farmagent.mcp_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as server:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        server.stdin.flush()
        line = server.stdout.readline()
        elapsed = time.perf_counter() - started
        server.stdin.close()
        server.wait(timeout=10)
    answer = json.loads(line)
    if answer.get("id") != 1 or "result" not in answer:
        raise SystemExit(f"unexpected initialize answer: {line!r}")
    return elapsed


def import_seconds(env: dict[str, str]) -> float:
    """Seconds a fresh interpreter spends importing `farmagent.mcp_server` (its own clock, not the spawn)."""
    code = "import time; t = time.perf_counter(); import farmagent.mcp_server; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout)


def main() -> None:
    """Run the spawns and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="spawns to time (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for queue in ("actions", "messages", "tasks", "action_results"):
            (Path(tmp) / queue).mkdir()
        env = {**os.environ, "FARMAGENT_IPC_DIR": tmp, "FARMAGENT_GROUP_DIR": tmp, "FARMAGENT_FARM_STATE_DIR": tmp}
        spawn_to_initialize(env)  # warm the page cache and the bytecode
        spawns = [spawn_to_initialize(env) for _ in range(args.runs)]
        imports = [import_seconds(env) for _ in range(max(3, args.runs // 2))]
    print(f"farmagent-mcp start-up on {os.cpu_count()} CPUs, {sys.executable}")
    print(
        f"  spawn -> initialize answered: median {statistics.median(spawns) * 1000:.0f} ms, "
        f"min {min(spawns) * 1000:.0f} ms, max {max(spawns) * 1000:.0f} ms ({len(spawns)} runs)"
    )
    print(
        f"  import farmagent.mcp_server:  median {statistics.median(imports) * 1000:.0f} ms, "
        f"min {min(imports) * 1000:.0f} ms ({len(imports)} runs)"
    )


if __name__ == "__main__":
    main()
