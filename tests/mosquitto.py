"""A real Mosquitto broker for the tests (Debian's `mosquitto`), started on a free port, killed and restarted.

The fixture `mosquitto` is one broker per test (a broker is cheap: ~10 ms to start); `users` turns on a password
file (`mosquitto_passwd`), so a test can check that a site must log in.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import wait_for

MOSQUITTO = "/usr/sbin/mosquitto"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Mosquitto:
    """One broker process on 127.0.0.1:`port`, its config and log in `root`."""

    def __init__(self, root: Path, *, users: dict[str, str] | None = None) -> None:
        if not Path(MOSQUITTO).exists():
            raise AssertionError("mosquitto is not installed: run scripts/debian-packages (Debian package mosquitto)")
        self.root = root
        self.port = _free_port()
        self.log_path = root / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {root}/"]
        if users:
            passwd = root / "passwd"
            passwd.write_text("")
            for user, password in users.items():
                tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
                subprocess.run([tool, "-b", str(passwd), user, password], check=True, capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        self.config = root / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """`mqtt://[user:password@]127.0.0.1:<port>`."""
        login = f"{user}:{password}@" if user else ""
        return f"mqtt://{login}127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        """Start it and wait until it accepts connections."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(lambda: _accepts(self.port), timeout=10, what=f"mosquitto on port {self.port}", seen=self.log)
        return self

    def kill(self) -> None:
        """Kill -9 (what a crash or a power cut does to the broker)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def log(self) -> str:
        """What the broker logged."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A running broker, anonymous access allowed."""
    root = tmp_path / "mosquitto"
    root.mkdir()
    broker = Mosquitto(root).start()
    try:
        yield broker
    finally:
        broker.kill()
