"""DemoHa: the demo's real Home Assistant with the simulated farm in `<data>/ha/`, started or reused, and its login.

The local-HA modules (`farmhost/localha/`, shared with the test suite) stay the one implementation of installing
HA, writing the farm configuration (`farmhost/localha/farm/`), seeding the owner's and farmhost's own user's
tokens and supervising `hass`. So the demo's farm is exactly the tests' farm, and a wheel
install has it too. farmhost talks to HA as its own user, so the farmer's clicks in the browser are a person's.

Files in `<data>/ha/` (the local HA's layout, `farmhost.localha.instance`): `config/` (HA's config dir, fresh at every start), `hass.log`,
`supervisor.pid`, `hass.pid`, `hass.rc`, `hass.modules` (what the last `hass` imported, for the supervisor to import
before it starts the next), and `ha.env` (HA_URL, HA_TOKEN: farmhost's own user's, HA_OWNER_TOKEN,
HA_WS_URL, HA_CONFIG_DIR; mode 0600), the same file `python -m farmhost.localha start --dir <data>/ha`
writes. A supervisor alive with a `ha.env` whose token HA accepts is reused instead of starting another HA; `--keep-ha` leaves the instance running for the next demo.

The browser login is another HA user, `demo` (administrator, local network only), created through HA's own
WebSocket API (`config/auth/create`, `config/auth_provider/homeassistant/create`); on a reused instance its
password is set again (`admin_change_password`), so the printed login always works.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from farmhost.errors import ConfigError
from farmhost.localha.errors import HaHttpError, HaSetupError
from farmhost.localha.install import HA_VERSION, install, installed_version, venv_dir
from farmhost.localha.instance import HaInstance, free_port

DEFAULT_PORT: Final = 8123
DEMO_USERNAME: Final = "demo"
DEMO_PASSWORD: Final = "demo-farm"  # HA listens on 127.0.0.1 only, and the user is local-only
DEMO_USER_NAME: Final = "Demo farmer"
STOP_TIMEOUT: Final = 30.0
START_TIMEOUT: Final = 90.0

Log = Callable[[str], None]


class HaProblem(RuntimeError):
    """Home Assistant could not be installed, started or reached; the message says why and what to do."""


def _pid_alive(path: Path) -> int | None:
    """The pid in `path` if that process exists."""
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None
    return pid


def _port_free(port: int) -> bool:
    """Whether HA could listen on `port`: like HA's server, SO_REUSEADDR (a port in TIME_WAIT is free)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_env_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines (the local HA's `ha.env`)."""
    values: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip()
    return values


class DemoHa:
    """The demo's Home Assistant in `root` (`<data>/ha`): install, start or reuse, demo login, stop."""

    def __init__(self, root: Path, *, port: int | None, keep: bool, log: Log) -> None:
        """Prepare (nothing starts before `start_or_reuse`).

        Args:
            root: the instance directory (`<data>/ha`).
            port: HA's HTTP port; None tries 8123 and falls back to a free one, 0 takes any free port.
            keep: leave HA running when the demo stops (started detached, so it outlives this process).
            log: where progress lines go.
        """
        self.root = root
        self.requested_port = port
        self.keep = keep
        self._log = log
        self._instance: HaInstance | None = None
        self._adopted_pid: int | None = None  # the supervisor of a reused instance (not our child)
        self.reused = False

    # ---- facts

    @property
    def env_path(self) -> Path:
        """`ha.env`: where a later demo (or `python -m farmhost.localha status`) finds this instance."""
        return self.root / "ha.env"

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return str(self._running().url)

    @property
    def token(self) -> str:
        """The seeded owner's long-lived token: the farmer's (a person's changes, never undone as an agent's)."""
        return str(self._running().token)

    @property
    def farmhost_token(self) -> str:
        """The long-lived token of farmhost's own HA user (what farmhost uses as HA_TOKEN)."""
        return str(self._running().farmhost_token)

    @property
    def log_path(self) -> Path:
        """HA's own log."""
        return self.root / "hass.log"

    # ---- lifecycle (blocking: the runner calls these in a worker thread)

    def install(self) -> None:
        """Install HA into the shared cache if it is not there yet (about 90 s the first time, with progress)."""
        try:
            if installed_version() == HA_VERSION:
                self._log(f"Home Assistant {HA_VERSION} is installed ({venv_dir()})")
                return
            install(self._log)
        except HaSetupError as err:
            raise HaProblem(str(err)) from None

    def start_or_reuse(self) -> None:
        """Reuse the instance an earlier demo left running in `root`, else start a fresh one; wait until RUNNING."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            if self._adopt():
                self.reused = True
                self._log(f"reusing the Home Assistant already running at {self.url} (supervisor {self._adopted_pid})")
                return
            port = self._choose_port()
            instance = HaInstance(self.root, port=port, log=self._log)
            self._log(f"starting Home Assistant {HA_VERSION} on port {port} (config in {instance.config_dir})")
            instance.prepare()
            self._instance = instance
            took = instance.start(timeout=START_TIMEOUT, watch_parent=not self.keep)
            instance.setup_farm()  # the local calendar and its events; then every farm entity is checked
        except (HaSetupError, HaHttpError, OSError) as err:
            self.stop(force=True)
            raise HaProblem(str(err)) from None
        self._write_env()
        self._log(f"Home Assistant RUNNING at {self.url} after {took:.1f} s")

    def ensure_login(self) -> tuple[str, str]:
        """Make sure the `demo` user exists with the demo password (HA's WebSocket API); returns the login."""
        try:
            self._ensure_login()
        except OSError as err:  # the WebSocket failed (ConnectionError included)
            raise HaProblem(f"cannot set up the demo login over HA's WebSocket API: {err}") from None
        return DEMO_USERNAME, DEMO_PASSWORD

    def _ensure_login(self) -> None:
        instance = self._running()
        with instance.ws() as ws:
            if ws.auth.get("type") != "auth_ok":
                raise HaProblem(f"Home Assistant refused the owner's token on its WebSocket API: {ws.auth}")
            users = self._result(ws.command("config/auth/list"), "list users")
            user = next((u for u in users if u.get("username") == DEMO_USERNAME), None)
            if user is None:
                created = self._result(
                    ws.command("config/auth/create", name=DEMO_USER_NAME, group_ids=["system-admin"], local_only=True),
                    "create the demo user",
                )
                self._result(
                    ws.command(
                        "config/auth_provider/homeassistant/create",
                        user_id=created["user"]["id"],
                        username=DEMO_USERNAME,
                        password=DEMO_PASSWORD,
                    ),
                    "give the demo user a password",
                )
            else:
                self._result(
                    ws.command(
                        "config/auth_provider/homeassistant/admin_change_password",
                        user_id=user["id"],
                        password=DEMO_PASSWORD,
                    ),
                    "set the demo user's password",
                )

    def stop(self, *, force: bool = False) -> None:
        """Stop HA and wait for it (supervisor and hass); with `keep` (and not `force`) leave it running instead."""
        instance, adopted = self._instance, self._adopted_pid
        if self.keep and not force and (instance is not None or adopted is not None):
            if instance is not None:
                instance.detach()  # started detached: it outlives us; the next demo finds it via ha.env
            self._log(f"Home Assistant keeps running at {self.url} (--keep-ha); the next demo in this dir reuses it")
            return
        if instance is not None and instance.running():
            self._log("stopping Home Assistant ...")
            rc = instance.stop(timeout=STOP_TIMEOUT)
            self._log(f"Home Assistant stopped (exit code {rc})")
        elif adopted is not None:
            self._log("stopping Home Assistant ...")
            self._stop_adopted(adopted)
        self._adopted_pid = None
        self.env_path.unlink(missing_ok=True)

    # ---- simulator and checks

    def get_states(self) -> list[dict[str, Any]]:
        """Every state in HA (REST)."""
        states: list[dict[str, Any]] = self._running().get_states()
        return states

    def hide_from_assist(self, entity_ids: list[str]) -> None:
        """Un-expose entities from Assist (WebSocket)."""
        try:
            self._running().hide_from_assist(entity_ids)
        except HaSetupError as err:
            raise HaProblem(str(err)) from None

    def set_number(self, entity_id: str, value: float) -> None:
        """`input_number.set_value` (REST)."""
        self._running().set_number(entity_id, value)

    # ---- internals

    def _running(self) -> HaInstance:
        if self._instance is None:
            raise HaProblem("Home Assistant is not started")
        return self._instance

    def _result(self, answer: dict[str, Any], what: str) -> Any:
        if not answer.get("success"):
            raise HaProblem(f"Home Assistant refused to {what}: {answer.get('error')}")
        return answer.get("result")

    def _choose_port(self) -> int:
        free = free_port()
        if self.requested_port == 0:
            return free
        if self.requested_port is None:
            if _port_free(DEFAULT_PORT):
                return DEFAULT_PORT
            self._log(f"port {DEFAULT_PORT} is in use (another Home Assistant?): using the free port {free}")
            return free
        if not _port_free(self.requested_port):
            raise ConfigError(f"port {self.requested_port} is in use; choose another with --port (0 = any free port)")
        return self.requested_port

    def _adopt(self) -> bool:
        """Take over an instance left running in `root` (by `--keep-ha` or `python -m farmhost.localha start`), if HA accepts us."""
        supervisor = _pid_alive(self.root / "supervisor.pid")
        env = read_env_file(self.env_path)
        url, token, owner = env.get("HA_URL", ""), env.get("HA_TOKEN", ""), env.get("HA_OWNER_TOKEN", "")
        if supervisor is None or not url.startswith("http://127.0.0.1:") or not token or not owner:
            return False
        port = int(url.rsplit(":", 1)[1])
        if self.requested_port not in (None, 0, port):
            self._log(f"an earlier Home Assistant runs on port {port}, not {self.requested_port}: stopping it")
            self._stop_adopted(supervisor)
            return False
        instance = HaInstance(self.root, port=port, log=self._log)
        instance.token, instance.farmhost_token = owner, token
        try:
            instance.wait_running(timeout=30.0)  # it may be restarting; HA refusing the token never gets RUNNING
            instance.check_entities()
        except HaSetupError as err:
            self._log(
                f"the Home Assistant left in {self.root} is not usable ({str(err).splitlines()[0]}): replacing it"
            )
            self._stop_adopted(supervisor)
            return False
        self._instance, self._adopted_pid = instance, supervisor
        return True

    def _stop_adopted(self, pid: int) -> None:
        """SIGTERM to a supervisor that is not our child; wait for it to go, KILL its group if it hangs."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _pid_alive(self.root / "supervisor.pid") == pid and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid_alive(self.root / "supervisor.pid") == pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        rc = (self.root / "hass.rc").read_text().strip() if (self.root / "hass.rc").exists() else "?"
        self._log(f"Home Assistant stopped (exit code {rc})")

    def _write_env(self) -> None:
        instance = self._running()
        values = {
            "HA_URL": instance.url,
            "HA_TOKEN": instance.farmhost_token,
            "HA_OWNER_TOKEN": instance.token,
            "HA_WS_URL": instance.ws_url,
            "HA_CONFIG_DIR": str(instance.config_dir),
        }
        text = "".join(f"{key}={value}\n" for key, value in values.items())
        fd = os.open(self.env_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
