"""`farmhost health`: the container/systemd health check, against real daemons that run, freeze, stop and die."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from farmhost_testing import Daemon, clean_env, farmhost, wait_for


def _health(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return farmhost("health", *args, data_dir=data_dir, env=env)


def test_no_database_and_no_daemon_are_unhealthy_with_the_fix(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = _health(data_dir)
    assert done.returncode == 1
    assert done.stdout == f"unhealthy: no farmhost database in {data_dir}; run `farmhost init --data-dir {data_dir}`\n"
    assert farmhost("init", data_dir=data_dir).returncode == 0
    done = _health(data_dir)
    assert done.returncode == 1
    assert done.stdout == f"unhealthy: no farmhost daemon holds {data_dir / 'farmhost.lock'}; start `farmhost run`\n"
    # A pid in the lock file is not a daemon: only a held lock is.
    (data_dir / "farmhost.lock").write_text(str(os.getpid()))
    assert _health(data_dir).returncode == 1


def test_a_daemon_without_groups_is_healthy_once_it_holds_the_lock(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert farmhost("init", data_dir=data_dir).returncode == 0
    daemon = Daemon(data_dir).start(wait_group=None)
    assert daemon.proc is not None
    try:
        done = wait_for(lambda: (d := _health(data_dir)).returncode == 0 and d, timeout=15, interval=0.1)
        assert done.stdout == (
            f"healthy: daemon pid {daemon.proc.pid} is running; no group is registered yet, so no heartbeat to check\n"
        )
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert _health(data_dir).returncode == 1


def test_a_frozen_daemon_turns_unhealthy_when_its_heartbeat_ages_and_healthy_again_when_it_resumes(
    data_dir: Path,
) -> None:
    env = clean_env(FARMHOST_HEARTBEAT_SECONDS="0.2")
    daemon = Daemon(data_dir, env=env).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    try:
        done = _health(data_dir, "--max-age", "1.5", env=env)
        assert done.returncode == 0, done.stdout
        assert done.stdout.startswith(f"healthy: daemon pid {pid} is running; heartbeat ")
        assert done.stdout.rstrip().endswith(("(field)", "(main)"))
        os.kill(pid, signal.SIGSTOP)
        try:
            stale = wait_for(
                lambda: (d := _health(data_dir, "--max-age", "1.5", env=env)).returncode == 1 and d,
                timeout=15,
                interval=0.3,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        assert stale.stdout.startswith(f"unhealthy: daemon pid {pid}: newest heartbeat (")
        assert "s old (limit 1.5 s)" in stale.stdout
        wait_for(lambda: _health(data_dir, "--max-age", "1.5", env=env).returncode == 0, timeout=15, interval=0.2)
    finally:
        assert daemon.stop() == 0, daemon.log()
    # Stopped cleanly: the heartbeat says so and the lock is free.
    assert json.loads((data_dir / "ipc" / "main" / "host_status.json").read_text())["status"] == "stopped"
    done = _health(data_dir)
    assert done.returncode == 1 and "no farmhost daemon holds" in done.stdout


def test_a_killed_daemon_is_unhealthy_at_once_although_its_last_heartbeat_is_fresh(data_dir: Path) -> None:
    daemon = Daemon(data_dir).start()
    assert _health(data_dir).returncode == 0
    daemon.kill()
    status = json.loads((data_dir / "ipc" / "main" / "host_status.json").read_text())
    assert status["status"] == "alive"  # kill -9 left no "stopped" behind...
    done = _health(data_dir)
    assert done.returncode == 1 and "no farmhost daemon holds" in done.stdout  # ...but the lock died with it


LOADED = """
import sys
from farmhost.cli import main

code = main(["health", "--data-dir", sys.argv[1]])
heavy = ("farmhost.app", "farmhost.cli.doctor", "farmhost.protocol.schema", "farmhost.agents.sandbox", "aiohttp")
print(code, sorted(m for m in sys.modules if m.startswith(heavy)))
"""


def test_the_health_check_loads_neither_the_daemon_nor_the_doctor(tmp_path: Path) -> None:
    """A container runs `farmhost health` every 30 s for as long as it runs: it imports what it reads, no more.

    The doctor's checks, the contract's schema and the daemon (the sandbox, aiohttp) are a command's own imports:
    loaded by the whole CLI they made each health check ~30 % more CPU (docs/performance.md).
    """
    data_dir = tmp_path / "data"
    assert farmhost("init", data_dir=data_dir).returncode == 0
    done = subprocess.run(
        [sys.executable, "-c", LOADED, str(data_dir)], capture_output=True, text=True, env=clean_env(), timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "1 []", done.stdout
