"""One running Home Assistant: its config dir and port, starting it under the supervisor, waiting, restarting, stopping."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Final

from farmhost.localha import supervisor
from farmhost.localha.config import seed_auth, write_config
from farmhost.localha.errors import HaHttpError, HaSetupError
from farmhost.localha.farm_client import FarmClient
from farmhost.localha.install import HA_VERSION, Log, install, log_to_stderr, venv_dir, venv_python

# Run by path with this interpreter: stdlib only, so it starts fast and imports nothing of farmhost's.
SUPERVISOR_SCRIPT: Final = Path(supervisor.__file__).resolve()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class HaInstance(FarmClient):
    """One Home Assistant in its own config dir and port, under a supervisor that restarts `hass` on exit 100.

    As a client it calls HA with the owner's token (`token`: a person's calls, the browser); `farmhost_token` is
    farmhost's own user's, what `env()` hands a farmhost as HA_TOKEN.
    """

    def __init__(self, root: Path, *, port: int | None = None, log: Log = log_to_stderr) -> None:
        """Name the instance (nothing is written or started before `prepare`/`start`).

        Args:
            root: the instance dir: `config/`, `hass.log`, the pid and exit-code files.
            port: HA's HTTP port on 127.0.0.1 (None: a free one).
            log: where progress lines go.
        """
        self.root = root
        self.config_dir = root / "config"
        self.port = port or free_port()
        super().__init__(f"http://127.0.0.1:{self.port}", token="")
        self.farmhost_token = ""  # farmhost's own user's: what env() gives farmhost as HA_TOKEN
        self.log_path = root / "hass.log"
        self._log = log
        self._supervisor: subprocess.Popen[bytes] | None = None
        self._down = False  # hass taken down (take_down), its supervisor waiting to start it again

    # ---- lifecycle

    def prepare(self) -> None:
        """Write a fresh config dir: the farm configuration, the seeded owner and farmhost's user, with tokens."""
        shutil.rmtree(self.config_dir, ignore_errors=True)
        self.config_dir.mkdir(parents=True)
        write_config(self.config_dir, self.port)
        # HA serves www/ as /local/ only when the directory existed at its start: made now, a custom card's file
        # put there later is served without restarting HA.
        (self.config_dir / "www").mkdir()
        seeded = seed_auth(self.config_dir)
        self.token, self.farmhost_token = seeded.owner_token, seeded.farmhost_token

    def start(self, *, timeout: float = 60.0, watch_parent: bool = True) -> float:
        """Start HA under the supervisor (or bring back one `take_down` stopped), wait until RUNNING; the seconds taken."""
        if (proc := self._supervisor) is not None and proc.poll() is None:
            if not self._down:
                return 0.0
            started = time.monotonic()
            self._down = False
            proc.send_signal(signal.SIGUSR2)
            self.wait_running(timeout=timeout)
            return time.monotonic() - started
        self._down = False  # a new supervisor starts hass at once
        if not self.token:
            self.prepare()
        python = venv_python()
        if not python.exists():
            raise HaSetupError(f"no HA venv at {venv_dir()}: run `.venv/bin/python -m farmhost.localha install`")
        started = time.monotonic()
        cmd = [
            str(python),  # HA's own interpreter: the supervisor preloads HA and forks each hass (supervisor.py)
            str(SUPERVISOR_SCRIPT),
            "--python",
            str(python),
            "--config",
            str(self.config_dir),
            "--log",
            str(self.log_path),
            "--pid-file",
            str(self.root / "hass.pid"),
            "--modules-cache",
            str(venv_dir() / "hass.modules"),
        ]
        if watch_parent:
            cmd += ["--parent", str(os.getpid())]
        self._supervisor = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        (self.root / "supervisor.pid").write_text(f"{self._supervisor.pid}\n")
        self.wait_running(timeout=timeout)
        return time.monotonic() - started

    def running(self) -> bool:
        """Whether this object's supervisor (and so hass, or its restart) is alive."""
        return self._supervisor is not None and self._supervisor.poll() is None

    def ensure_running(self, *, timeout: float = 60.0) -> None:
        """Start HA again if a test stopped it (same config dir, port and token); wait until it is RUNNING."""
        if not self.running() or self._down:
            self.start(timeout=timeout)
        elif self.core_state() != "RUNNING":
            self.wait_running(timeout=timeout)

    def take_down(self, *, timeout: float = 30.0) -> int | None:
        """Stop hass but keep its supervisor: HA is off (its port closed) until `start` or `ensure_running`.

        An outage for a test at half the cost of `stop` and `start`: the next hass is forked from the supervisor,
        which has HA imported already. Returns hass's exit code.
        """
        proc = self._supervisor
        if proc is None or proc.poll() is not None:
            return self.stop(timeout=timeout)
        rc_file = self.root / "hass.rc"
        rc_file.unlink(missing_ok=True)
        self._down = True
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(FileNotFoundError, ValueError):  # ValueError: read while being written
                return int(rc_file.read_text())
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HaSetupError(f"hass did not go down within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM to the supervisor (it stops hass); KILL the process group only if that hangs. Returns hass's rc."""
        proc, self._supervisor, self._down = self._supervisor, None, False
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._log(f"HA did not stop within {timeout} s: killing its process group {proc.pid}")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        rc_file = self.root / "hass.rc"
        return int(rc_file.read_text()) if rc_file.exists() else None

    def detach(self) -> None:
        """Let HA outlive this object (started with `watch_parent=False`); `supervisor.pid` in `root` still finds it."""
        self._supervisor = None

    def hass_pid(self) -> int | None:
        """The pid of the current `hass` process (it changes on every restart)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int((self.root / "hass.pid").read_text())
        return None

    def core_state(self) -> str | None:
        """`/api/config` state (RUNNING, NOT_RUNNING, STARTING...), or None when HA does not answer."""
        try:
            config = self.api("GET", "/api/config", timeout=2.0)
        except (OSError, HaHttpError, ValueError):
            return None
        state: str | None = config.get("state")
        return state

    def wait_running(self, *, timeout: float = 60.0) -> float:
        """Poll `/api/config` until the core is RUNNING; fails early (with the log's tail) if the supervisor died."""
        started = time.monotonic()
        deadline = started + timeout
        while self.core_state() != "RUNNING":
            if self._supervisor is not None and self._supervisor.poll() is not None:
                raise HaSetupError(f"Home Assistant exited during start-up:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise HaSetupError(f"Home Assistant was not RUNNING after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)
        return time.monotonic() - started

    def restart(self, *, timeout: float = 60.0) -> float:
        """`homeassistant.restart` through the API; waits for a new hass process to be RUNNING. Returns seconds."""
        old_pid = self.hass_pid()
        started = time.monotonic()
        self.call_service("homeassistant", "restart")
        deadline = started + timeout
        while self.hass_pid() == old_pid:
            if time.monotonic() > deadline:
                raise HaSetupError(f"hass {old_pid} did not exit after homeassistant.restart:\n{self.log_tail()}")
            time.sleep(0.05)
        self.wait_running(timeout=max(1.0, deadline - time.monotonic()))
        return time.monotonic() - started

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of hass.log (for error messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def env(self) -> dict[str, str]:
        """HA_URL and HA_TOKEN (farmhost's own user's token, not the owner's) for a farmhost talking to this instance."""
        return {"HA_URL": self.url, "HA_TOKEN": self.farmhost_token}


def start_session_instance(root: Path, *, log: Log = log_to_stderr, watch_parent: bool = True) -> HaInstance:
    """Install if needed, then prepare, start and set up a farm instance in `root`; stops it again on failure."""
    install(log)
    instance = HaInstance(root, log=log)
    instance.prepare()
    try:
        took = instance.start(watch_parent=watch_parent)
        instance.setup_farm()
    except BaseException:
        instance.stop()
        raise
    log(f"Home Assistant {HA_VERSION} RUNNING at {instance.url} after {took:.1f} s (config {instance.config_dir})")
    return instance
