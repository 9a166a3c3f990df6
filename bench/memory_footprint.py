"""Memory footprint of a deployment: the idle daemon, one agent run, and Home Assistant beside them.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/memory_footprint.py            # ~40 s (HA's start included)
    .venv/bin/python bench/memory_footprint.py --no-ha    # the daemon without Home Assistant
    .venv/bin/python bench/memory_footprint.py --groups 8 --settle 20

Every figure is read from `/proc/<pid>/status` of real processes:

- the daemon: `farmhost run` (a subprocess of this interpreter) on a fresh data dir with `--groups` groups,
  connected to the test suite's real Home Assistant (so the farm state collector polls it), VmRSS after
  `--settle` seconds idle, and again after the agent run, with its VmHWM (peak);
- one agent run: a scheduled task fires an agent in bubblewrap, which calls `memory_search` through IPC and
  sends a message (the LLM is the suite's scripted server); its processes are sampled every 10 ms and the figure
  is the largest VmHWM of one process and the largest sum of PSS over the run's processes;
- a dashboard screenshot (with HA): `ha_apply_dashboard` then `ha_capture_screenshot` at 1280x800, Chromium's
  processes sampled the same way;
- Home Assistant: the `hass` process of the test instance (2025.4.4, the farm configuration of farmhost/localha/farm), VmRSS
  after the same settle time.

The figures are documented in docs/deployment.md. The script reports; it never gates (exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # farmhost_dev: the dev tools at the repo root

from farmhost.store import outbox
from farmhost.store.db import Database
from farmhost_dev.llm_stub import Reply, ScriptedLLM, ToolCall
from farmhost_dev.testing import Daemon, clean_env, drop, register_in_process, wait_for, wait_result


def status_kb(pid: int, field: str) -> int:
    """`field` (VmRSS, VmHWM) of /proc/<pid>/status in kB; 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def pss_kb(pid: int) -> int:
    """Proportional set size of `pid` in kB (shared pages divided among their users); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc/*/stat parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class TreeSampler(threading.Thread):
    """Samples the daemon's descendants every 10 ms: peak VmHWM of one process, peak PSS sum of all.

    PSS, not RSS, for the sum: Chromium's processes share most of their pages, and RSS would count them each time.
    """

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop_event = threading.Event()
        self.peak_process_kb = 0
        self.peak_tree_kb = 0
        self.processes_seen: set[int] = set()

    def run(self) -> None:
        """Sample until `stop_event` is set."""
        while not self.stop_event.is_set():
            pids = descendants(self.root)
            self.processes_seen.update(pids)
            self.peak_tree_kb = max(self.peak_tree_kb, sum(pss_kb(p) for p in pids))
            for pid in pids:
                self.peak_process_kb = max(self.peak_process_kb, status_kb(pid, "VmHWM"))
            time.sleep(0.01)


def _outbox_bodies(data_dir: Path) -> list[str]:
    db = Database.open(data_dir)
    try:
        return [e.body or "" for e in outbox.list_entries(db.conn)]
    finally:
        db.close()


def _mb(kb: int) -> str:
    return f"{kb / 1024:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4, help="registered groups (default 4, one of them main)")
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds before reading RSS (default 10)")
    parser.add_argument("--no-ha", action="store_true", help="run the daemon without Home Assistant")
    args = parser.parse_args(argv)

    figures: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "groups": args.groups,
    }
    with tempfile.TemporaryDirectory(prefix="farmhost-mem-") as tmp, ScriptedLLM() as llm:
        root = Path(tmp)
        data_dir = root / "data"
        register_in_process(data_dir, jid="telegram:100", name="Farm office", folder="main", is_main=True)
        for i in range(1, args.groups):
            register_in_process(data_dir, jid=f"telegram:{200 + i}", name=f"Field {i}", folder=f"field{i}")
        env = clean_env(
            TZ="UTC",
            FARMHOST_AGENT_RUNTIME="bwrap",
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_MODEL="bench-model",
            FARMHOST_LLM_API_KEY="sk-bench",
        )
        ha = None
        if not args.no_ha:
            from farmhost.localha.install import install
            from farmhost.localha.instance import HaInstance

            install()
            ha = HaInstance(root / "ha")
            took = ha.start(timeout=120)
            env.update(ha.env())
            print(f"Home Assistant started in {took:.1f} s", file=sys.stderr)
        daemon = Daemon(data_dir, env=env).start(timeout=30)
        assert daemon.proc is not None
        pid = daemon.proc.pid
        try:
            time.sleep(args.settle)
            figures["daemon idle VmRSS"] = _mb(status_kb(pid, "VmRSS"))
            if ha is not None and (hass := ha.hass_pid()):
                figures["Home Assistant VmRSS"] = _mb(status_kb(hass, "VmRSS"))
                figures["Home Assistant VmHWM"] = _mb(status_kb(hass, "VmHWM"))

            llm.script(
                ToolCall("memory_search", {"query": "irrigation"}),
                ToolCall("send_message", {"chatJid": "telegram:100", "text": "Soil moisture is fine."}),
                Reply("Told the office."),
            )
            sampler = TreeSampler(pid)
            sampler.start()
            due = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S")
            drop(data_dir, "main", "tasks", {"type": "schedule_task", "prompt": "Check the soil.",
                                              "schedule_type": "once", "schedule_value": due})  # fmt: skip
            wait_for(lambda: _outbox_bodies(data_dir), timeout=60, interval=0.2, what="the agent's message")
            time.sleep(0.5)
            sampler.stop_event.set()
            sampler.join()
            figures["agent run: largest process VmHWM"] = _mb(sampler.peak_process_kb)
            figures["agent run: all its processes, peak PSS sum"] = _mb(sampler.peak_tree_kb)
            figures["agent run: processes seen"] = len(sampler.processes_seen)
            figures["daemon VmRSS after the run"] = _mb(status_kb(pid, "VmRSS"))
            if ha is not None:
                # A dashboard screenshot: Chromium runs as the daemon's child (inside its systemd cgroup).
                for request_id, action, params in (
                    ("apply", "ha_apply_dashboard", {"dashboard": "farm"}),
                    ("shot", "ha_capture_screenshot", {"dashboard": "farm", "width": 1280, "height": 800}),
                ):
                    shots = TreeSampler(pid)
                    shots.start()
                    drop(data_dir, "main", "actions", {"type": "farm_action", "requestId": request_id,
                                                        "action": action, "params": params})  # fmt: skip
                    result = wait_result(data_dir, "main", request_id, timeout=60)
                    shots.stop_event.set()
                    shots.join()
                    assert result["status"] == "success", result
                figures["screenshot: Chromium's processes, peak PSS sum"] = _mb(shots.peak_tree_kb)
                figures["screenshot: largest process VmHWM"] = _mb(shots.peak_process_kb)
            figures["daemon VmHWM (peak)"] = _mb(status_kb(pid, "VmHWM"))
        finally:
            assert daemon.stop() == 0, daemon.log()
            if ha is not None:
                ha.stop()
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(json.dumps(figures), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
