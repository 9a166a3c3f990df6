"""The sandbox's walls (issue 33: sockets, setuid, logs, threads) held by the real daemon running a command agent."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

from farmhost_testing import clean_env, init_data_dir_in_process, running_daemon, scaled, wait_for
from runtime_support import SOCKETS, Sandbox, logged_answer, run_logs, schedule_run

from farmhost.agents.sandbox.mounts import GROUP_DIR

ZONE = "Europe/Lisbon"


def test_the_daemon_holds_the_walls_around_a_command_agent(tmp_path: Path, sandbox: Sandbox) -> None:
    """Through the daemon's scheduler: sockets, threads at 256 MB, a setuid file below 8 KiB of path, host logs."""
    data_dir = init_data_dir_in_process(tmp_path / "data")
    env = clean_env(
        TZ=ZONE,
        **sandbox.values,
        **sandbox.env,
        FARMHOST_AGENT_KIND="command",
        FARMHOST_AGENT_COMMAND=shlex.join(sandbox.command),
        FARMHOST_AGENT_MEMORY_MB="256",
    )
    workspace = data_dir / "groups" / "field"
    with running_daemon(data_dir, env=env) as daemon:
        schedule_run(data_dir, json.dumps({"sockets": SOCKETS, "threads": 100, "deep_setid": {GROUP_DIR: 8192}}))
        [first] = wait_for(lambda: run_logs(data_dir, 1), timeout=scaled(60), what="the first run's log")
        seen = logged_answer(first)
        schedule_run(data_dir, json.dumps({"write": [f"{GROUP_DIR}/logs/{first.name}"], "list": [GROUP_DIR]}))
        [_, second] = wait_for(lambda: run_logs(data_dir, 2), timeout=scaled(60), what="the second run's log")
        later = logged_answer(second)
        assert "Traceback" not in daemon.log()
    assert seen["sockets"] == {
        **dict.fromkeys(SOCKETS, "error:EAFNOSUPPORT"),
        "socket(AF_UNIX)": "ok",
        "socketpair(AF_UNIX)": "ok",
    }
    assert seen["threads"] == [100, None]
    assert seen["deep_setid"] == {GROUP_DIR: [8241, "0o6755"]}
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(41):
            below = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        mode = os.stat("sh-root", dir_fd=fd, follow_symlinks=False).st_mode
    finally:
        os.close(fd)
    assert stat.S_IMODE(mode) & (stat.S_ISUID | stat.S_ISGID) == 0, oct(mode)
    # The second run started (the deep tree locked nobody out) and found no log of the first to rewrite.
    assert "logs" not in later["list"][GROUP_DIR]
    assert logged_answer(first) == seen
