"""A tool call as an MCP agent sees it: MCP client -> farmagent-mcp in a bwrap sandbox -> IPC file -> farmhost.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/mcp_tool_call.py            # 1,000 calls after 100 warm-up, about 30 s
    .venv/bin/python bench/mcp_tool_call.py --calls 200

One real `farmhost run` daemon on a fresh data dir; `farmagent-mcp` runs inside bubblewrap with only the
group's IPC directory writable, as in an agent run, and the official `mcp` SDK's stdio client calls its
`ping` tool one call at a time. In the same run and against the same daemon, the agent-side file round trip
(`bench/roundtrip_client.py`: write, rename, wait for the result with inotify) and the daemon's own
processing time (`durationMs` in logs/requests.ndjson) are measured for comparison. Target (issue 14):
the MCP call's p50 no more than 3 ms above the host's own processing p50. Reports; never gates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from roundtrip_client import percentile, sequential
from roundtrip_hosts import FarmhostDaemon, make_data_dir

TARGET_ABOVE_HOST_MS = 3.0
GAP_S = 0.003


def sandboxed_server(ipc_dir: str) -> StdioServerParameters:
    """farmagent-mcp in bwrap: the host read-only, the group's IPC directory the only writable place, no network."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SystemExit("bubblewrap is not installed (scripts/debian-packages)")
    args = ["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # The IPC directory at its own path: the read-only root has no /workspace to mount it on.
    args += ["--tmpfs", "/tmp", "--bind", ipc_dir, ipc_dir, "--", sys.executable, "-m", "farmagent.mcp_server"]
    env = {"PATH": os.defpath, "FARMAGENT_IPC_DIR": ipc_dir, "FARMAGENT_GROUP_DIR": "/tmp"}
    return StdioServerParameters(command=bwrap, args=args, env=env)


async def mcp_calls(ipc_dir: str, *, calls: int, warmup: int) -> list[float]:
    """Milliseconds of `calls` sequential `ping` tool calls through the MCP client."""
    samples = []
    async with stdio_client(sandboxed_server(ipc_dir)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for i in range(warmup + calls):
            started = time.perf_counter()
            result = await session.call_tool("ping", {})
            elapsed = (time.perf_counter() - started) * 1000
            if result.is_error:
                raise RuntimeError(f"ping through MCP failed: {result.content}")
            if i >= warmup:
                samples.append(elapsed)
            await asyncio.sleep(GAP_S)
    return sorted(samples)


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls counted (after a tenth as many warm-up)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="farmhost-mcp-bench-"))
    try:
        daemon = FarmhostDaemon(make_data_dir(root, 1))
        try:
            group = daemon.group_dir(0)
            mcp = asyncio.run(mcp_calls(group, calls=args.calls, warmup=args.calls // 10))
            host = sorted(daemon.processing_ms(args.calls))
            files = sequential(group, n=args.calls, warmup=args.calls // 10, gap=lambda: GAP_S, fsync=False)
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    host_p50 = statistics.median(host)
    rows = [
        ("MCP tool call (ping), sandboxed server", percentile(mcp, 0.5), percentile(mcp, 0.99)),
        ("file round trip, same daemon", files.p50_ms, files.p99_ms),
        ("host's own processing (durationMs)", host_p50, percentile(host, 0.99)),
    ]
    print(f"{'':<42} {'p50 ms':>8} {'p99 ms':>8}")
    for name, p50, p99 in rows:
        print(f"{name:<42} {p50:>8.2f} {p99:>8.2f}")
    above = percentile(mcp, 0.5) - host_p50
    verdict = "PASS" if above <= TARGET_ABOVE_HOST_MS else "FAIL"
    print(f"MCP p50 above the host's processing: {above:.2f} ms (target <= {TARGET_ABOVE_HOST_MS:g} ms): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
