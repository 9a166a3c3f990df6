"""Test helpers: drive the real `farmhost` CLI and daemon as subprocesses and drop real request files."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a farmhost subprocess: no farmhost/HA/Telegram settings but `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(extra)
    return env


def farmhost(
    *args: str, data_dir: Path, env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `farmhost <args> --data-dir <data_dir>` and return the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "farmhost", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        cwd=data_dir.parent,
        timeout=timeout,
        input=input,
        check=False,
    )


def wait_for(condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.005, what: str = "") -> T:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)


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
    """The result of a request, if it is there."""
    try:
        return json.loads(result_path(data_dir, folder, request_id).read_bytes())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def wait_result(data_dir: Path, folder: str, request_id: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """Wait for and return the result of a request."""
    return wait_for(lambda: read_result(data_dir, folder, request_id), timeout=timeout, what=f"result {request_id}")


def quarantined(data_dir: Path, folder: str) -> list[dict[str, Any]]:
    """The `.reason.json` notes of a group's quarantine, oldest first."""
    errors = data_dir / "ipc" / "errors" / folder
    if not errors.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(errors.glob("*.reason.json"))]


class Daemon:
    """A real `farmhost run` process on a data directory."""

    def __init__(self, data_dir: Path, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.env = env or clean_env()
        self.args = args  # extra `farmhost run` options, e.g. ("--log-format", "json")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / "daemon.log"

    def start(self, *, wait_group: str | None = "main", timeout: float = 15.0) -> Daemon:
        """Start the daemon and wait until it reports alive in `wait_group`'s host_status.json."""
        status = self.data_dir / "ipc" / (wait_group or "") / "host_status.json"
        before = status.stat().st_mtime_ns if wait_group and status.exists() else None
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "farmhost", "run", "--data-dir", str(self.data_dir), *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.data_dir.parent,
        )
        log.close()
        if wait_group:
            wait_for(lambda: self._alive(status, before), timeout=timeout, what="daemon start")
        return self

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
        """Send `sig` and wait for the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """Kill -9."""
        self.stop(signal.SIGKILL)

    def log(self) -> str:
        """Everything the daemon printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


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
            register(conn, layout, group)
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
