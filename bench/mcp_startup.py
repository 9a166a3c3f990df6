"""Start-up benchmark of `farmagent-mcp`: spawn -> `initialize` and `tools/list` answered, and the module imports.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/mcp_startup.py              # 10 spawns
    .venv/bin/python bench/mcp_startup.py --runs 30

Each run spawns ``python -m farmagent.mcp_server`` on a fresh temporary IPC directory (no host is needed to
answer the handshake), writes a JSON-RPC ``initialize`` line on its stdin, reads the answer, sends
``notifications/initialized`` and ``tools/list`` as a client does, and stops the clock when the tool listing
arrives: what an MCP client waits before it can offer the tools to its model (target, issue 14: under 0.5 s).
A last ``ping`` is answered by the SDK itself, so each run also checks that the server went on serving. The
import of ``farmagent.mcp_server`` and of the ``mcp`` SDK's server modules are timed in fresh interpreters as
well. The script reports; it never gates: the exit status is 0 whatever the figures.
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
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
PING = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
TARGET_S = 0.5


def _exchange(server: subprocess.Popen[bytes], message: dict[str, object]) -> dict[str, object]:
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write(json.dumps(message).encode() + b"\n")
    server.stdin.flush()
    line = server.stdout.readline()
    answer = json.loads(line)
    if answer.get("id") != message["id"] or "result" not in answer:
        raise SystemExit(f"unexpected answer to {message['method']}: {line!r}")
    return dict(answer)


def spawn_to_tools(env: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawning the server to its `initialize` answer and to its `tools/list` answer."""
    started = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-m", "farmagent.mcp_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    ) as server:
        assert server.stdin is not None
        _exchange(server, INITIALIZE)
        initialized = time.perf_counter() - started
        server.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
        listing = _exchange(server, TOOLS_LIST)
        listed = time.perf_counter() - started
        _exchange(server, PING)
        server.stdin.close()
        server.wait(timeout=10)
    result = listing["result"]
    if not isinstance(result, dict) or not result.get("tools"):
        raise SystemExit(f"tools/list listed no tools: {listing!r}")
    return initialized, listed


def import_seconds(env: dict[str, str]) -> float:
    """Seconds a fresh interpreter spends importing `farmagent.mcp_server` (its own clock, not the spawn)."""
    code = "import time; t = time.perf_counter(); import farmagent.mcp_server; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout)


def sdk_import_seconds(env: dict[str, str]) -> float:
    """Seconds a fresh interpreter spends importing the SDK modules the server runs on."""
    code = (
        "import time; t = time.perf_counter(); import mcp.server.lowlevel, mcp.server.stdio; "
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout)


def _ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:.0f} ms, min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}"
    )


def main() -> None:
    """Run the spawns and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="spawns to time (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for queue in ("actions", "messages", "tasks", "action_results"):
            (Path(tmp) / queue).mkdir()
        env = {**os.environ, "FARMAGENT_IPC_DIR": tmp, "FARMAGENT_GROUP_DIR": tmp, "FARMAGENT_FARM_STATE_DIR": tmp}
        spawn_to_tools(env)  # warm the page cache and the bytecode
        runs = [spawn_to_tools(env) for _ in range(args.runs)]
        imports = [import_seconds(env) for _ in range(max(3, args.runs // 2))]
        sdk = [sdk_import_seconds(env) for _ in range(max(3, args.runs // 2))]
    listed = [listed for _, listed in runs]
    print(f"farmagent-mcp start-up on {os.cpu_count()} CPUs, {sys.executable}, {len(runs)} runs")
    print(f"  spawn -> initialize answered:  {_ms([initialized for initialized, _ in runs])}")
    print(f"  spawn -> tools/list answered:  {_ms(listed)}")
    print(f"  import farmagent.mcp_server:   {_ms(imports)}")
    print(f"  import the mcp SDK's server:   {_ms(sdk)}")
    verdict = "PASS" if statistics.median(listed) < TARGET_S else "FAIL"
    print(f"tools/list answered within {TARGET_S:g} s of the spawn (median): {verdict}")


if __name__ == "__main__":
    main()
