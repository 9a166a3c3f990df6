"""A real Mosquitto broker for the tests (Debian's `mosquitto`), started on a free port, killed and restarted.

The fixture `mosquitto` is one broker per test (a broker is cheap: ~10 ms to start); `users` turns on a password
file (`mosquitto_passwd`), so a test can check that a site must log in; `tls` makes it a TLS listener that logs
clients in by their certificate (its common name is the user, as docs/mqtt.md sets up), and `acl` the broker's
access rules (`SITE_ACL`: the ACL file of docs/mqtt.md, read from the docs).
"""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import wait_for

MOSQUITTO = "/usr/sbin/mosquitto"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "mqtt.md"


def _documented_acl() -> str:
    """The ACL file of docs/mqtt.md ("Broker accounts and access rules per site"), word for word."""
    blocks = DOCS.read_text(encoding="utf-8").split("```")[1::2]  # the fenced blocks' contents
    (acl,) = [b.lstrip("\n") for b in blocks if b.lstrip("\n").startswith("# /etc/mosquitto/acl")]
    return acl


# The broker's access rules as docs/mqtt.md gives them: the tests hold the docs to them. Its site logins are
# `pumphouse` and `greenhouse`, Home Assistant's `homeassistant`, a device's `tasmota1`.
SITE_ACL = _documented_acl()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Certificates:
    """A test CA, the broker's certificate for 127.0.0.1 and one client certificate per name (its CN)."""

    def __init__(self, root: Path, clients: tuple[str, ...]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.ca = root / "ca.crt"
        key = root / "ca.key"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=farmhost test CA",
                 "-keyout", str(key), "-out", str(self.ca))  # fmt: skip
        self.server = self._signed(root, "broker", key, san="IP:127.0.0.1")
        self.clients = {name: self._signed(root, name, key) for name in clients}

    def _signed(self, root: Path, name: str, ca_key: Path, san: str | None = None) -> tuple[Path, Path]:
        cert, key, request = root / f"{name}.crt", root / f"{name}.key", root / f"{name}.csr"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
                 "-out", str(request))  # fmt: skip
        extra: list[str] = []
        if san:
            ext = root / f"{name}.ext"
            ext.write_text(f"subjectAltName={san}\n")
            extra = ["-extfile", str(ext)]
        _openssl("x509", "-req", "-in", str(request), "-CA", str(self.ca), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-days", "2", "-out", str(cert), *extra)  # fmt: skip
        return cert, key


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

    def __init__(
        self,
        root: Path,
        *,
        users: dict[str, str] | None = None,
        tls: Certificates | None = None,
        acl: str | None = None,
        log_denied: bool = False,
    ) -> None:
        if not Path(MOSQUITTO).exists():
            raise AssertionError("mosquitto is not installed: run scripts/debian-packages (Debian package mosquitto)")
        self.root = root
        self.port = _free_port()
        self.log_path = root / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Run as root, mosquitto drops to the user `mosquitto`, which cannot read the test's private tmp dir.
        lines = [f"listener {self.port} 127.0.0.1", "persistence true", f"persistence_location {root}/",
                 f"user {getpass.getuser()}"]  # fmt: skip
        if tls is not None:
            server_cert, server_key = tls.server
            lines += [f"cafile {tls.ca}", f"certfile {server_cert}", f"keyfile {server_key}",
                      "require_certificate true", "use_identity_as_username true", "allow_anonymous false"]  # fmt: skip
        if acl is not None:
            (root / "acl").write_text(acl)
            lines.append(f"acl_file {root / 'acl'}")
        if log_denied:  # Mosquitto logs a publish its ACL denies (`Denied PUBLISH from <client id>`) only at debug
            lines.append("log_type all")
        if users and tls is None:
            passwd = root / "passwd"
            passwd.write_text("")
            for user, password in users.items():
                tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
                subprocess.run([tool, "-b", str(passwd), user, password], check=True, capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        else:
            lines.append("allow_anonymous true")
        self.tls = tls
        self.config = root / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """`mqtt[s]://[user:password@]127.0.0.1:<port>`."""
        login = f"{user}:{password}@" if user else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{login}127.0.0.1:{self.port}"

    def start(self) -> Mosquitto:
        """Start it and wait until it accepts connections."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        try:
            wait_for(lambda: _accepts(self.port), timeout=10, what=f"mosquitto on port {self.port}", seen=self.log)
        except BaseException:
            self.kill()
            raise
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
