"""Helpers for the `farmhost demo` tests: the demo as a real subprocess, its printed summary, HA's login flow."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from farmhost_testing import scaled, wait_for
from ha_fixture import HA_VERSION, installed_version

SUMMARY_LINE = re.compile(r"^  ([A-Z][A-Za-z ]+):\s+(.*)$")


def require_cached_ha() -> None:
    """The demo installs HA itself when it is missing; in a test that would take 90 s, so demand the cache."""
    assert installed_version() == HA_VERSION, (
        f"Home Assistant {HA_VERSION} is not installed in the cache: run `make ha`"
    )


class DemoProcess:
    """`python -m farmhost demo --data-dir D ...` with stdin and stdout piped; every printed line collected."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "farmhost", "demo", "--data-dir", str(data_dir), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=data_dir.parent,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        """Everything printed so far (stdout and stderr)."""
        with self._lock:
            return "\n".join(self.lines)

    def wait_line(self, match: str | Callable[[str], bool], *, timeout: float = 30.0) -> str:
        """The first printed line containing `match` (or satisfying it); fails with the output so far."""
        test = match if callable(match) else (lambda line: match in line)

        def found() -> str | None:
            if self.proc.poll() is not None and not self._reader.is_alive():
                with self._lock:
                    hit = next((line for line in self.lines if test(line)), None)
                if hit is None:
                    raise AssertionError(f"the demo exited with {self.proc.returncode}:\n{self.output()}")
                return hit
            with self._lock:
                return next((line for line in self.lines if test(line)), None)

        try:
            return wait_for(found, timeout=timeout, interval=0.05, what=str(match))
        except AssertionError as err:
            raise AssertionError(f"{err}\n--- demo output ---\n{self.output()}") from None

    def summary(self) -> dict[str, str]:
        """The `  Label:  value` lines of the "where to look" block."""
        with self._lock:
            return {m[1]: m[2] for line in self.lines if (m := SUMMARY_LINE.match(line))}

    def send(self, text: str) -> None:
        """Type a line into the demo's chat."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        """End of input."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def stop(self, sig: int = signal.SIGINT, *, timeout: float = 45.0) -> int:
        """Send `sig`, wait for the exit status and the last line."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=scaled(timeout))
        self._reader.join(timeout=scaled(5))
        return code

    def ha_pids(self) -> list[int]:
        """The HA supervisor's and hass's pids as the instance dir records them."""
        return ha_pids(self.data_dir)

    def kill_leftovers(self, *, ha: bool = True) -> None:
        """After the block: kill the demo if it still runs (and, with `ha`, any HA it left); close the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if ha:
            kill_ha(self.data_dir)
        self._reader.join(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def ha_pids(data_dir: Path) -> list[int]:
    """The pids `<data>/ha/` records for the demo's HA supervisor and hass."""
    pids = []
    for name in ("supervisor.pid", "hass.pid"):
        with contextlib.suppress(FileNotFoundError, ValueError):
            pids.append(int((data_dir / "ha" / name).read_text()))
    return pids


def kill_ha(data_dir: Path) -> None:
    """Kill a demo's HA that is still running (a --keep-ha instance is detached from the demo)."""
    for pid in ha_pids(data_dir):
        if alive(pid) and _is_home_assistant(pid):  # never a stale pid that now belongs to someone else
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def demo(data_dir: Path, *args: str, env: dict[str, str], leave_ha: bool = False) -> Iterator[DemoProcess]:
    """A running demo for the block; afterwards the demo is gone, and so is its HA unless `leave_ha`."""
    process = DemoProcess(data_dir, *args, env=env)
    try:
        yield process
    finally:
        process.kill_leftovers(ha=not leave_ha)


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _is_home_assistant(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"homeassistant" in cmdline or b"farmhost/localha/supervisor.py" in cmdline


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (fails if it is not one)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _post(url: str, body: dict[str, Any], *, form: bool = False, token: str | None = None) -> Any:
    data = urllib.parse.urlencode(body).encode() if form else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded" if form else "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def login_step(base_url: str, username: str, password: str) -> dict[str, Any]:
    """HA's login flow as its login page runs it: the answer to the username/password step."""
    client_id = f"{base_url}/"
    flow = _post(
        f"{base_url}/auth/login_flow",
        {"client_id": client_id, "handler": ["homeassistant", None], "redirect_uri": f"{base_url}/?auth_callback=1"},
    )
    answer: dict[str, Any] = _post(
        f"{base_url}/auth/login_flow/{flow['flow_id']}",
        {"username": username, "password": password, "client_id": client_id},
    )
    return answer


def login(base_url: str, username: str, password: str) -> str:
    """Log in like the browser does (login flow, then the authorization code for tokens); the access token."""
    answer = login_step(base_url, username, password)
    assert answer["type"] == "create_entry", answer
    tokens = _post(
        f"{base_url}/auth/token",
        {"grant_type": "authorization_code", "code": answer["result"], "client_id": f"{base_url}/"},
        form=True,
    )
    token: str = tokens["access_token"]
    return token


def get_state(base_url: str, token: str, entity_id: str) -> dict[str, Any]:
    """One entity's state over REST."""
    request = urllib.request.Request(f"{base_url}/api/states/{entity_id}")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        state: dict[str, Any] = json.loads(response.read())
        return state


def call_service(base_url: str, token: str, domain: str, service: str, data: dict[str, Any]) -> Any:
    """One HA service call over REST."""
    return _post(f"{base_url}/api/services/{domain}/{service}", data, token=token)


def ha_answers(base_url: str) -> bool:
    """Whether anything answers HTTP at HA's address."""
    try:
        with urllib.request.urlopen(f"{base_url}/manifest.json", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def changed_soil(base_url: str, token: str, *, timeout: float = 10.0) -> tuple[float, float]:
    """Field 1's soil moisture now and, after the simulator moved it, the new value (`timeout` scaled)."""
    first = float(get_state(base_url, token, "sensor.field_1_soil_moisture")["state"])
    limit = scaled(timeout)  # the simulator steps in a thread doing REST calls to HA: both slow down on a busy machine
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        now = float(get_state(base_url, token, "sensor.field_1_soil_moisture")["state"])
        if now != first:
            return first, now
        time.sleep(0.1)
    raise AssertionError(f"field 1's soil moisture stayed at {first} for {limit:.1f} s")
