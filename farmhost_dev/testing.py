"""Test and benchmark helpers: drive the real `farmhost` CLI and daemon as subprocesses, drop real request files.

Tests import these through tests/farmhost_testing.py; bench/ imports them from here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from farmhost_dev.forkserver import Forked, ForkServer

if TYPE_CHECKING:
    from farmhost.store.groups import Group

T = TypeVar("T")

MAIN_JID, FIELD_JID = "telegram:100", "telegram:200"

# Variables a developer's shell might carry that would change what the tests see.
_SCRUB = (
    "FARMHOST_",
    "HA_URL",
    "HA_TOKEN",
    "TELEGRAM_",
    "FARM_MODE",
    "FARM_PROFILE_PATH",
    "TZ",
    "DOCKER_HOST",  # a Docker engine makes docker the default agent runtime
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a farmhost subprocess: no farmhost/HA/Telegram settings but `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(extra)
    return env


def farmhost(
    *args: str, data_dir: Path, env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `farmhost <args> --data-dir <data_dir>` and return the finished process (`timeout` scaled)."""
    argv = [*args, "--data-dir", str(data_dir)]
    env = env or clean_env()
    server = fork_server(env)
    if server is None:
        return subprocess.run(
            [sys.executable, "-m", "farmhost", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=data_dir.parent,
            timeout=scaled(timeout),
            input=input,
            check=False,
        )
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stdin.write((input or "").encode())
        stdin.seek(0)
        stdio = [f.fileno() for f in (stdin, stdout, stderr)]
        proc = server.spawn(argv, env=env, cwd=data_dir.parent, stdio=stdio)
        try:
            code = proc.wait(scaled(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(
            ["farmhost", *argv], code, stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
        )


# Set to 0: every `farmhost` process of the tests starts as `python -m farmhost`, not forked from the server.
FORK_SERVER_ENV = "FARMHOST_TEST_FORKSERVER"
_fork_server: ForkServer | None = None
_fork_server_lock = threading.Lock()


def fork_server(env: Mapping[str, str] | None = None) -> ForkServer | None:
    """This process's farmhost fork server (farmhost_dev/forkserver.py), started on first use.

    None when it is off, or when `env` sets a variable that only acts at a process's start (PYTHONPATH, ...)
    differently from the server's: such a process must be exec'd.
    """
    global _fork_server
    if os.environ.get(FORK_SERVER_ENV, "1") == "0":
        return None
    with _fork_server_lock:
        if _fork_server is None or not _fork_server.alive():
            _fork_server = ForkServer(clean_env())
        return _fork_server if env is None or _fork_server.can_fork(env) else None


# Deadlines ------------------------------------------------------------------------------------------------
#
# A test waits for the condition its assertion needs, never for a fixed sleep; its deadline only bounds how long a
# broken host may keep it waiting. Deadlines are written for an idle machine and stretched by `timeout_scale()` on a
# busy one, so a loaded CI box (or a developer running two suites at once) gets slower tests, not failing ones.

TIMEOUT_SCALE_ENV = "FARMHOST_TEST_TIMEOUT_SCALE"
# Without the variable, the scale follows the load: 1 + (1-minute load average per CPU), between 1 and this.
MAX_LOAD_SCALE = 4.0


def timeout_scale() -> float:
    """How many times longer than on an idle machine a test may wait (at least 1).

    FARMHOST_TEST_TIMEOUT_SCALE (a number >= 1) when set; otherwise measured now: 1 + the 1-minute load average per
    CPU, at most MAX_LOAD_SCALE (a 2-core machine with load 4 waits 3x as long).
    """
    raw = os.environ.get(TIMEOUT_SCALE_ENV, "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{TIMEOUT_SCALE_ENV} must be a number >= 1, got {raw!r}") from None
        if not value >= 1:
            raise ValueError(f"{TIMEOUT_SCALE_ENV} must be a number >= 1, got {raw!r}")
        return value
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return min(MAX_LOAD_SCALE, max(1.0, 1.0 + load / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    """A deadline of `seconds` on an idle machine, stretched for this one (see `timeout_scale`)."""
    return seconds * timeout_scale()


# A hold is this many times the latency it must outlast, measured in the test just before.
HOLD_MARGIN = 4.0


def hold_for(measured: float, *, least: float, margin: float = HOLD_MARGIN) -> float:
    """How long a test holds something (an on-period, a `for`, a scheduler step) that it must act inside.

    A deadline (`scaled`, `wait_for`) ends as soon as its condition holds, so stretching it by the load average costs
    nothing when the test passes. A hold always costs its whole length: with four xdist workers on two cores the load
    average is itself 3-4, so a load-scaled hold is three times longer than needed in every run. And the load average
    is a poor guess of what a hold must outlast: it lags a minute behind and says nothing of this test's own path.
    So a hold is sized by a latency measured in the test right before, on the same path (the round trip of a request
    like the one the hold must outlast, a daemon start), times `margin`, and never shorter than `least`: the shortest
    hold that still tells a correct product from a broken one. Where a test can read what happened from timestamps
    (Home Assistant's `last_changed`, its history, a row's due time), it asserts on those instead of on a hold.
    """
    if measured < 0:
        raise ValueError(f"a measured latency is never negative, got {measured}")
    return max(least, measured * margin)


def _describe(value: object, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class _Deadline:
    """A scaled deadline that, given `progress`, restarts whenever the progress value changes (at most `cap`)."""

    def __init__(
        self, timeout: float, what: str, seen: Callable[[], object] | None, progress: Callable[[], object] | None
    ) -> None:
        self.limit = scaled(timeout)
        self.what, self.seen, self.progress = what, seen, progress
        self.started = self.moved = time.monotonic()
        self.cap = self.started + 10 * self.limit
        self.last_progress = progress() if progress else None

    def check(self, last: object) -> None:
        """Raise the failure (with `last`, the condition's last value) if the deadline passed; progress resets it."""
        now = time.monotonic()
        if self.progress is not None:
            current = self.progress()
            if current != self.last_progress:
                self.last_progress, self.moved = current, now
        if now - self.moved <= self.limit and now <= self.cap:
            return
        waited = now - self.started
        stalled = f", no progress for {now - self.moved:.1f} s" if self.progress is not None else ""
        message = f"timed out after {waited:.1f} s (deadline {self.limit:.1f} s{stalled}) waiting for {self.what}"
        message += f"; last saw {_describe(last)}"
        if self.seen is not None:
            message += f"; {_describe(self.seen(), 4000)}"
        raise AssertionError(message)


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    interval: float = 0.005,
    what: str = "",
    seen: Callable[[], object] | None = None,
    progress: Callable[[], object] | None = None,
) -> T:
    """Poll `condition` until it returns something truthy, and return that.

    Fails after `timeout` seconds (scaled for the machine's load, see `scaled`) with what it waited for, the last
    value `condition` returned and, when given, `seen()` (what the test can show about the state). With `progress`,
    the deadline runs from the last change of `progress()` instead (for a long drain that keeps moving), up to ten
    deadlines in all.
    """
    deadline = _Deadline(timeout, what or getattr(condition, "__name__", repr(condition)), seen, progress)
    while True:
        value = condition()
        if value:
            return value
        deadline.check(value)
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], T | None | Awaitable[T | None]],
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
    what: str = "",
    seen: Callable[[], object] | None = None,
    progress: Callable[[], object] | None = None,
) -> T:
    """`wait_for` for a test on an event loop: polls without blocking it; `condition` may be a coroutine function."""
    deadline = _Deadline(timeout, what or getattr(condition, "__name__", repr(condition)), seen, progress)
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        deadline.check(value)
        await asyncio.sleep(interval)


def drop(
    data_dir: Path,
    folder: str,
    queue: str,
    payload: dict[str, Any] | bytes,
    *,
    name: str | None = None,
) -> str:
    """Write a request the way an agent does (dot-temp file, then rename); returns the file's stem."""
    queue_dir = data_dir / "ipc" / folder / queue
    if name is None:
        rid = payload.get("requestId") if isinstance(payload, dict) else None
        name = f"{rid or f'{time.time_ns()}-{secrets.token_hex(3)}'}.json"
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    tmp = queue_dir / f".{name}.{secrets.token_hex(3)}.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, queue_dir / name)
    return name.removesuffix(".json")


def result_path(data_dir: Path, folder: str, request_id: str) -> Path:
    """Where the result of a request appears."""
    return data_dir / "ipc" / folder / "action_results" / f"{request_id}.json"


def read_result(data_dir: Path, folder: str, request_id: str) -> dict[str, Any] | None:
    """The result of a request, if it is there (a directory planted at its name is not one: the host evicts it)."""
    try:
        return json.loads(result_path(data_dir, folder, request_id).read_bytes())  # type: ignore[no-any-return]
    except (FileNotFoundError, IsADirectoryError):
        return None


def wait_result(data_dir: Path, folder: str, request_id: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """Wait for and return the result of a request (`timeout` scaled, like every deadline here)."""
    return wait_for(
        lambda: read_result(data_dir, folder, request_id),
        timeout=timeout,
        what=f"the result of {request_id} in {result_path(data_dir, folder, request_id).parent}",
        seen=lambda: f"queued there: {_queued(data_dir, folder)}",
    )


def round_trip(data_dir: Path, folder: str = "main") -> float:
    """Seconds a ping took through the running daemon, from the drop to its result.

    What to size a hold by (`hold_for`) when the test must get a request handled inside it (a once time still ahead
    when the request arrives).
    """
    started = time.monotonic()
    wait_result(
        data_dir, folder, drop(data_dir, folder, "actions", {"type": "ping", "requestId": secrets.token_hex(6)})
    )
    return time.monotonic() - started


def once_time(data_dir: Path, folder: str, zone: tzinfo) -> datetime:
    """A once time (whole seconds, in `zone`) still ahead when the running daemon handles a task dropped now.

    Ahead by a round trip through the daemon timed now, as a hold (`hold_for`), plus the second the truncation may
    take: a once time already past when the request is handled is refused.
    """
    ahead = 1 + math.ceil(hold_for(round_trip(data_dir, folder), least=1))
    return datetime.now(zone).replace(microsecond=0) + timedelta(seconds=ahead)


def _queued(data_dir: Path, folder: str) -> list[str]:
    found = []
    for where in (data_dir / "ipc" / folder, data_dir / "ipc" / ".spool" / folder):
        if where.is_dir():
            found += [f"{p.parent.name}/{p.name}" for p in where.glob("*/*.json") if p.parent.name != "action_results"]
    return sorted(found)


def quarantined(data_dir: Path, folder: str) -> list[dict[str, Any]]:
    """The `.reason.json` notes of a group's quarantine, oldest first.

    A note the host is writing right now (created, still empty or half written) is left out: a caller polling
    this sees it on a later call, complete.
    """
    errors = data_dir / "ipc" / "errors" / folder
    if not errors.is_dir():
        return []
    found = []
    for path in sorted(errors.glob("*.reason.json")):
        try:
            found.append(json.loads(path.read_bytes()))
        except (FileNotFoundError, ValueError):  # ValueError: JSONDecodeError, or UTF-8 cut mid-character
            continue
    return found


class Daemon:
    """A real `farmhost run` process on a data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        python: str | Path = sys.executable,
    ) -> None:
        self.data_dir = data_dir
        self.env = env or clean_env()
        self.args = args  # extra `farmhost run` options, e.g. ("--log-format", "json")
        self.python = python  # the interpreter whose farmhost runs (another venv's, for an installed wheel)
        self.proc: subprocess.Popen[bytes] | Forked | None = None  # forked from the fork server unless it is off
        self.log_path = data_dir.parent / "daemon.log"

    def start(self, *, wait_group: str | None = "main", timeout: float = 15.0) -> Daemon:
        """Start the daemon and wait until it reports alive in `wait_group`'s host_status.json."""
        status = self.data_dir / "ipc" / (wait_group or "") / "host_status.json"
        before = status.stat().st_mtime_ns if wait_group and status.exists() else None
        argv = ["run", "--data-dir", str(self.data_dir), *self.args]
        server = fork_server(self.env) if Path(self.python) == Path(sys.executable) else None
        with open(self.log_path, "ab") as log:
            if server is not None:
                with open(os.devnull, "rb") as null:
                    self.proc = server.spawn(
                        argv, env=self.env, cwd=self.data_dir.parent, stdio=[null.fileno(), log.fileno(), log.fileno()]
                    )
            else:
                self.proc = subprocess.Popen(
                    [str(self.python), "-m", "farmhost", *argv],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.data_dir.parent,
                )
        if wait_group:
            try:
                wait_for(
                    lambda: self._alive(status, before),
                    timeout=timeout,
                    what=f"the daemon to report alive in {status}",
                    seen=lambda: f"daemon log:\n{self.log()[-3000:]}",
                )
            except BaseException:
                self._reap()  # a daemon that failed to start must not outlive the test (and write into its tmp dir)
                raise
        return self

    def _reap(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _alive(self, status: Path, before: int | None) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        try:
            doc = json.loads(status.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return False
        return bool(doc.get("status") == "alive" and doc.get("pid") == self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send `sig` and wait for the exit code (`timeout` scaled)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=scaled(timeout))
        except subprocess.TimeoutExpired:
            self._reap()
            raise AssertionError(
                f"the daemon did not exit within {scaled(timeout):.1f} s of signal {sig}; log:\n{self.log()[-3000:]}"
            ) from None
        self.proc = None
        return code

    def kill(self) -> None:
        """Kill -9."""
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        """Everything the daemon printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def write_tree(base: Path, files: Mapping[str, str]) -> None:
    """Write each `relative path -> text` under `base`, making the directories on the way."""
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def inotify_instances() -> int:
    """How many inotify instances this process holds (its `anon_inode:inotify` descriptors)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with suppress(OSError):  # the listing's own descriptor, closed already
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


def init_data_dir(root: Path) -> Path:
    """`farmhost init` on `root`, then groups `main` (main, telegram:100) and `field` (telegram:200)."""
    for args in (
        ("init",),
        ("group", "add", "--jid", MAIN_JID, "--name", "Farm office", "--folder", "main", "--main"),
        ("group", "add", "--jid", FIELD_JID, "--name", "Field crew", "--folder", "field"),
    ):
        done = farmhost(*args, data_dir=root)
        assert done.returncode == 0, done.stderr
    return root


def copy_data_dir(template: Path, root: Path) -> Path:
    """A copy at `root` of a data dir that `init_data_dir` made and nothing used since.

    The same layout, modes and database, in milliseconds instead of three CLI starts (seconds each when busy).
    """
    assert not (template / "farmhost.db-wal").exists(), f"{template} is in use: copy only an idle data dir"
    shutil.copytree(template, root, symlinks=True)
    return root


def init_data_dir_in_process(root: Path) -> Path:
    """The same layout as `init_data_dir`, made in-process through the registry (no CLI start-up cost)."""
    register_in_process(root, jid=MAIN_JID, name="Farm office", folder="main", is_main=True)
    register_in_process(root, jid=FIELD_JID, name="Field crew", folder="field")
    return root


def register_in_process(
    root: Path, *, jid: str, name: str, folder: str, is_main: bool = False, requires_trigger: bool = True
) -> None:
    """Register a group in `root` (created if needed) the way `farmhost group add` does, without a subprocess."""
    from farmhost.groups.registry import new_group, register
    from farmhost.layout import DataLayout
    from farmhost.store.db import Database, now_utc

    layout = DataLayout(root)
    layout.create()
    db = Database.open(root)
    try:
        with db.tx() as conn:
            group = new_group(
                conn, jid=jid, name=name, folder=folder, trigger=None, requires_trigger=requires_trigger,
                is_main=is_main, at=now_utc(),
            )  # fmt: skip
            register(conn, layout, group, reuse=True)
    finally:
        db.close()


def group_lookup(root: Path) -> Callable[[str], Group | None]:
    """The registry lookup the app gives the agent runtime: a fresh read of the database (sees new groups at once)."""
    from farmhost.store.db import Database
    from farmhost.store.groups import get_group

    def lookup(folder: str) -> Group | None:
        db = Database.open(root)
        try:
            return get_group(db.conn, folder)
        finally:
            db.close()

    return lookup


@contextmanager
def running_daemon(data_dir: Path, *, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon for the block; it must stop cleanly (exit 0) at the end."""
    daemon = Daemon(data_dir, env=env).start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None:
            assert daemon.stop() == 0, daemon.log()


def ok(result: dict[str, Any]) -> Any:
    """The `result` of a successful answer (fails the test otherwise)."""
    assert result["status"] == "success", result
    return result["result"]


def refused(result: dict[str, Any], code: str, *words: str) -> str:
    """The error sentence of a refusal with `code` that mentions every one of `words`."""
    assert result["status"] == "error" and result["errorCode"] == code, result
    message: str = result["error"]
    for word in words:
        assert word in message, message
    return message
