"""The fork server the tests start farmhost from: each child is a process of its own, as `python -m farmhost` makes.

What the suite relies on: the child runs with the environment, working directory and streams it was given (not the
server's), its exit code and a signal that killed it come back as `Popen.returncode` would say them, and a child
stopped with kill -9 is gone.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import signal
import sys
import time
from pathlib import Path

from farmhost_testing import Daemon, clean_env, farmhost, fork_server, wait_for

from farmhost import __version__
from farmhost_dev import forkserver


def test_a_cli_call_gets_its_own_streams_exit_code_and_environment(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = farmhost("--version", data_dir=data_dir)
    assert (done.returncode, done.stdout.strip()) == (0, f"farmhost {__version__}")

    # A setting only the child's environment holds: the child reads it, and refuses its bad value.
    bad = farmhost("task", "list", data_dir=data_dir, env=clean_env(FARMHOST_LOG_LEVEL="LOUD"))
    assert bad.returncode == 2 and "FARMHOST_LOG_LEVEL" in bad.stderr and bad.stdout == ""
    assert "FARMHOST_LOG_LEVEL" not in os.environ  # nothing of it leaked into this process

    missing = farmhost("task", "list", data_dir=data_dir)
    assert missing.returncode == 2 and f"no farmhost database in {data_dir}" in missing.stderr


def test_a_forked_daemon_is_a_process_of_its_own_that_kill_9_ends(data_dir: Path) -> None:
    assert fork_server() is not None  # the suite's default (FARMHOST_TEST_FORKSERVER unset)
    daemon = Daemon(data_dir, env=clean_env(FARMHOST_LOG_LEVEL="DEBUG")).start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    assert pid != os.getpid()
    assert Path(f"/proc/{pid}/cwd").resolve() == data_dir.parent.resolve()
    assert " DEBUG " in daemon.log()  # its own settings, read after the fork (/proc/<pid>/environ shows the exec's)
    daemon.proc.send_signal(signal.SIGKILL)
    assert daemon.proc.wait(timeout=10) == -signal.SIGKILL
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=5, what="the killed daemon to be reaped")
    daemon.proc = None

    again = Daemon(data_dir).start()  # the same data dir, a new process
    assert again.proc is not None and again.proc.pid != pid
    assert again.stop() == 0
    assert "Traceback" not in again.log()


def test_a_process_whose_start_variables_differ_is_execd_not_forked() -> None:
    # PYTHONPATH, LD_PRELOAD and the like act only at an interpreter's start: a fork would silently ignore them.
    assert fork_server(clean_env()) is not None
    assert fork_server(clean_env(PYTHONPATH="/elsewhere")) is None
    assert fork_server(clean_env(LD_PRELOAD="libfoo.so")) is None


def test_a_child_ends_as_pythons_shutdown_would_without_tearing_the_modules_down(tmp_path: Path) -> None:
    """`_end`: thread pools nobody shut down end, atexit functions run, buffered output is flushed, the code kept."""
    witness = tmp_path / "atexit"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            sys.stdout = open(1, "w", buffering=8192, closefd=False)  # noqa: SIM115 - flushed by _end, or lost
            pool = concurrent.futures.ThreadPoolExecutor(2)
            pool.submit(time.sleep, 0.01).result()  # its idle, non-daemon workers wait for more work
            atexit.register(witness.write_text, "ran")
            print("buffered", end="")
            forkserver._end(7)
        finally:
            os._exit(99)
    os.close(write_end)
    statuses: list[int] = []

    def reaped() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        statuses.extend([status] if done else [])
        return bool(done)

    try:
        wait_for(reaped, timeout=10, what="the child to end (a pool's idle workers would keep a plain join waiting)")
    finally:
        if not statuses:  # a hung child of this pytest process would hold its output open
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(statuses[0]) == 7
    with os.fdopen(read_end, "rb") as out:
        assert out.read() == b"buffered"
    assert witness.read_text() == "ran"
