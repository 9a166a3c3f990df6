"""The real daemon while a group's agent, in its bubblewrap run, attacks the LLM proxy with bodies that grow when built.

Issue 33, finding 3: one 256 MB run sent 8 concurrent 4 MiB bodies of tiny JSON objects; the daemon parsed them on
its event loop, went from 135 MB to 677 MB and blocked the loop 375 ms for every group. A body nested a million
levels deep got an uncaught 500 and no log line. The agent here is the group's own program (kind `command`), so the
bodies come from inside the sandbox, within the group's limits, as a hostile agent would send them.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import Daemon, clean_env, drop, init_data_dir_in_process, ok, once_time, wait_for, wait_result
from llm_stub import Reply, ScriptedLLM

from farmhost.agents.proxy.parse import MAX_DEPTH, MAX_VALUES
from farmhost_dev.proxy_attack import REPORT, agent_command, status_kb

pytestmark = pytest.mark.slow  # a real daemon and a real agent run in bubblewrap

ZONE = "Europe/Lisbon"
BODIES = 8  # the run's default connection cap: all of them at once
# Far above what the check itself costs (about 40 MB of bodies in flight), far below the 540 MB the old parse took.
MAX_RSS_GROWTH_MB = 150
# A loop that parses a 4 MiB body of `{}` stalls 250 ms or more on this hardware; a preempted daemon on a loaded
# machine may wake one tick late, which is why one late wake-up is forgiven.
LATE_MS = 150


def _lag(data_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((data_dir / "logs" / "loop_lag.json").read_bytes())
    return document


def _late(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Wake-ups later than LATE_MS between two loop_lag.json documents, by the bucket's upper edge."""
    edges = [*before["bucketEdgesMs"], "inf"]
    counts = [b - a for a, b in zip(before["counts"], after["counts"], strict=True)]
    # A wake-up counts in the first bucket whose edge is at least its lag: buckets above LATE_MS's edge are late.
    return {f"<={edge}ms": n for edge, n in zip(edges, counts, strict=True) if n and (edge == "inf" or edge > LATE_MS)}


def test_bodies_that_grow_when_built_cost_the_daemon_neither_memory_nor_loop_time(tmp_path: Path) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    limits = {"groups": {"field": {"agentKind": "command", "agentCommand": agent_command("tiny", BODIES)}}}
    (data_dir / "agent-limits.json").write_text(json.dumps(limits))
    with ScriptedLLM(then=Reply("done")) as llm:
        env = clean_env(
            TZ=ZONE,
            FARMHOST_AGENT_RUNTIME="bwrap",
            FARMHOST_LLM_BASE_URL=llm.base_url,
            FARMHOST_LLM_MODEL="farm-model",
            FARMHOST_LLM_API_KEY="sk-attack-secret",
        )
        daemon = Daemon(data_dir, env=env)
        daemon.start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        try:
            wait_for(lambda: (data_dir / "logs" / "loop_lag.json").exists(), what="the loop monitor's first figures")
            lag_before, rss_before = _lag(data_dir), status_kb(pid, "VmRSS")
            due = once_time(data_dir, "field", ZoneInfo(ZONE))
            task = {"type": "schedule_task", "prompt": "attack", "schedule_type": "once"}
            rid = drop(data_dir, "field", "tasks", {**task, "schedule_value": due.strftime("%Y-%m-%dT%H:%M:%S")})
            ok(wait_result(data_dir, "field", rid))
            report = data_dir / "groups" / "field" / REPORT
            wait_for(report.exists, timeout=120, interval=0.2, what="the agent's attack to end")
            attacked_at = datetime.now().timestamp()
            ping = drop(data_dir, "main", "actions", {"type": "ping"})
            assert ok(wait_result(data_dir, "main", ping, timeout=15))["pong"] is True
            wait_for(lambda: _lag(data_dir)["updatedAt"] > attacked_at + 1, what="the loop monitor's figures")
            lag_after, peak = _lag(data_dir), status_kb(pid, "VmHWM")
            log = daemon.log()
        finally:
            code = daemon.stop(timeout=10)
    assert code == 0, log[-3000:]
    attack = json.loads(report.read_text())
    *tiny, deep = attack["answers"]
    assert attack["bodyBytes"] <= 4 * 1024 * 1024
    too_many = f"the request body holds more than {MAX_VALUES} JSON values"
    assert [(status, message.startswith(too_many)) for status, message in tiny] == [(400, True)] * BODIES, tiny
    assert deep == [400, f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels"]
    assert llm.requests == []
    growth_mb = (peak - rss_before) / 1024
    late = _late(lag_before, lag_after)
    print(f"daemon RSS {rss_before / 1024:.0f} MB, peak {peak / 1024:.0f} MB (+{growth_mb:.0f}); late wake-ups {late}")
    assert growth_mb < MAX_RSS_GROWTH_MB, f"the daemon grew {growth_mb:.0f} MB under the attack"
    assert sum(late.values()) <= 1, f"the event loop woke more than {LATE_MS} ms late: {late}"
    assert log.count(f"request refused: {too_many}") == BODIES
    assert "request refused: the request body nests arrays and objects deeper than" in log
    assert "Traceback" not in log, log[-3000:]
