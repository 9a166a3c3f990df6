"""Hosts for the IPC benchmark: the real `farmhost run` daemon and the in-script baseline host loops."""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from inotify_simple import INotify
from inotify_simple import flags as inotify_flags

DAEMON_START_TIMEOUT_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Removed from the daemon's environment: a developer's shell must not change what is measured.
_SCRUB = ("FARMHOST_", "HA_URL", "HA_TOKEN", "TELEGRAM_", "FARM_MODE", "FARM_PROFILE_PATH", "TZ")


def cpu_seconds(pid: int) -> float:
    """CPU time (utime + stime) of a process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def task_schedstat(pid: int) -> tuple[int, int]:
    """CPU time (ns) and timeslices (one per wake-up) of every thread of a process, from its threads' schedstat.

    A thread that ended between two readings takes its figures with it: measure a process whose threads stay.
    """
    cpu_ns = slices = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                fields = handle.read().split()
            cpu_ns, slices = cpu_ns + int(fields[0]), slices + int(fields[2])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return cpu_ns, slices


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MB (10^6 bytes)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    return math.nan


class Host(Protocol):
    """Something that answers ping requests in `ipc/<folder>/actions/`."""

    pid: int

    def group_dir(self, index: int) -> str:
        """`ipc/<folder>` of the index-th group."""
        ...

    def stop(self) -> None:
        """Stop and wait for the process."""
        ...


def folder_name(index: int) -> str:
    """The folder of the index-th benchmark group."""
    return f"g{index:02d}"


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(extra)
    return env


def _farmhost_cli(data_dir: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "farmhost", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=data_dir.parent,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"farmhost {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


def chat_jid(index: int) -> str:
    """The chat of the index-th benchmark group."""
    return f"telegram:{1000 + index}"


def _add_group(data_dir: Path, index: int) -> None:
    main = ("--main",) if index == 0 else ()
    jid, name = chat_jid(index), f"Bench {index}"
    _farmhost_cli(data_dir, "group", "add", "--jid", jid, "--name", name, "--folder", folder_name(index), *main)


def make_data_dir(root: Path, groups: int, *, template: Path | None = None) -> Path:
    """A fresh data dir with `groups` groups (g00 is main), added with `farmhost group add`.

    Args:
        root: an empty directory to create `data/` in.
        groups: how many groups it must have.
        template: an existing data dir with fewer groups (g00.. added by this function) to copy first.
    """
    root.mkdir(parents=True, exist_ok=True)
    data_dir = root / "data"
    have = 0
    if template is not None:
        shutil.copytree(template, data_dir, symlinks=True)
        have = len([p for p in (template / "ipc").iterdir() if p.name.startswith("g")])
    if have == 0:
        _add_group(data_dir, 0)
        have = 1
    with ThreadPoolExecutor(max_workers=2) as pool:  # each CLI call is ~0.5 s of CPU-bound start-up; two cores
        for job in [pool.submit(_add_group, data_dir, i) for i in range(have, groups)]:
            job.result()
    return data_dir


class FarmhostDaemon:
    """`python -m farmhost run --data-dir D` as a subprocess."""

    def __init__(
        self, data_dir: Path, *, mode: str = "inotify", poll_seconds: float | None = None, **settings: str
    ) -> None:
        self.data_dir = data_dir
        env = _clean_env(FARMHOST_IPC_MODE=mode, **settings)
        if poll_seconds is not None:
            env["FARMHOST_IPC_POLL_SECONDS"] = str(poll_seconds)
        self.log_path = data_dir.parent / f"daemon-{mode}.log"
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "farmhost", "run", "--data-dir", str(data_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=data_dir.parent,
            )
        self.pid = self._proc.pid
        self._wait_alive()

    def _wait_alive(self) -> None:
        status = self.data_dir / "ipc" / folder_name(0) / "host_status.json"
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"farmhost run exited with {self._proc.returncode}:\n{self.log_path.read_text()}")
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                doc = json.loads(status.read_bytes())
                if doc.get("status") == "alive" and doc.get("pid") == self.pid:
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"farmhost run did not report alive within {DAEMON_START_TIMEOUT_S:g} s")

    def processing_ms(self, last: int, *, request_prefix: str = "") -> list[float]:
        """`durationMs` of the last `last` requests in logs/requests.ndjson: the host's own time per request.

        With `request_prefix`, only the requests whose requestId starts with it (one client's).
        """
        lines = (self.data_dir / "logs" / "requests.ndjson").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines]
        mine = [row for row in rows if str(row.get("requestId", "")).startswith(request_prefix)]
        return [float(row["durationMs"]) for row in mine[-last:]]

    def group_dir(self, index: int) -> str:
        """`ipc/<folder>` of the index-th group."""
        return str(self.data_dir / "ipc" / folder_name(index))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop within 10 s (the contract's limit)."""
        terminate(self._proc, 10)


def terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a child, SIGKILL it if it has not ended `grace` seconds later, and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _baseline_result(request_id: str) -> bytes:
    return json.dumps(
        {"requestId": request_id, "type": "ping", "status": "success", "result": {"pong": True}, "error": None}
    ).encode()


def _answer_file(actions: str, results: str, name: str, *, fsync: bool) -> None:
    path = os.path.join(actions, name)
    try:
        with open(path, "rb") as handle:
            request = json.loads(handle.read())
        os.unlink(path)
    except (FileNotFoundError, json.JSONDecodeError):
        return
    request_id = str(request.get("requestId") or name[: -len(".json")])
    tmp = os.path.join(results, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, _baseline_result(request_id))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(results, name))


# A script host's entry point: (group dirs, poll interval, ready event to set, stop event to honour).
HostMain = Callable[[list[str], float, Any, Any], None]


def poll_host_main(group_dirs: list[str], interval: float, ready: Any, stop: Any) -> None:
    """The polling baseline: every `interval` s, list each actions/ dir, answer every `*.json` in name order."""
    ready.set()
    while not stop.is_set():
        for group_dir in group_dirs:
            actions, results = os.path.join(group_dir, "actions"), os.path.join(group_dir, "action_results")
            for name in sorted(os.listdir(actions)):
                if name.endswith(".json") and not name.startswith("."):
                    _answer_file(actions, results, name, fsync=False)
        stop.wait(interval)


def inotify_host_main(group_dirs: list[str], interval: float, ready: Any, stop: Any) -> None:
    """The raw floor: inotify on each actions/ dir, answer each renamed-in file at once (result fsync'd)."""
    inotify = INotify()
    by_wd = {inotify.add_watch(os.path.join(d, "actions"), inotify_flags.MOVED_TO): d for d in group_dirs}
    ready.set()
    while not stop.is_set():
        for event in inotify.read(timeout=200):
            if event.name.endswith(".json") and not event.name.startswith("."):
                group_dir = by_wd[event.wd]
                actions, results = os.path.join(group_dir, "actions"), os.path.join(group_dir, "action_results")
                _answer_file(actions, results, event.name, fsync=True)


class ScriptHost:
    """A baseline host loop from this script, in its own process, on plain directories."""

    def __init__(self, root: Path, groups: int, main: HostMain, interval: float) -> None:
        self._dirs = []
        for i in range(groups):
            group_dir = root / "ipc" / folder_name(i)
            for sub in ("actions", "action_results"):
                (group_dir / sub).mkdir(parents=True, exist_ok=True)
            self._dirs.append(str(group_dir))
        ctx = mp.get_context("fork")
        ready, self._stop = ctx.Event(), ctx.Event()
        self._proc = ctx.Process(target=main, args=(self._dirs, interval, ready, self._stop), daemon=True)
        self._proc.start()
        assert self._proc.pid is not None
        self.pid = self._proc.pid
        if not ready.wait(10):
            self.stop()
            raise RuntimeError(f"the {main.__name__} host did not start")

    def group_dir(self, index: int) -> str:
        """`ipc/<folder>` of the index-th group."""
        return self._dirs[index]

    def stop(self) -> None:
        """Ask the loop to end and wait for it."""
        self._stop.set()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
