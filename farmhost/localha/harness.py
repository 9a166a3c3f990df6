"""The test suite's real Home Assistant: cached install, farm config, seeded token, supervised start/stop (stdlib only).

Command line (any Python >= 3.11; `.venv/bin/python` or the system `python3`):

    .venv/bin/python -m farmhost.localha.harness install            # create/refresh the cached venv (no-op when up to date)
    .venv/bin/python -m farmhost.localha.harness start [--dir D]    # fresh config in D, start HA detached, write D/ha.env
    .venv/bin/python -m farmhost.localha.harness status [--dir D]   # print D/ha.env if the instance runs (exit 1 if not)
    .venv/bin/python -m farmhost.localha.harness stop [--dir D]     # SIGTERM to the supervisor (KILL only if it hangs)

The test suite's pytest plugin (`ha_fixture`, in a source checkout only) uses the same code (`install()`, `HaInstance`);
its README in the checkout's test directory describes the test instance.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

HA_VERSION = "2025.4.4"  # the newest release whose Requires-Python accepts 3.13.0
HA_FRONTEND = "20250411.0"  # must equal homeassistant/components/frontend/manifest.json of HA_VERSION
UV_BOOTSTRAP = "uv==0.6.10"  # HA 2025.4.4 pins uv==0.6.10 itself; phase 2 keeps it
# Requirements of integrations the farm config loads that are not core dependencies (installed up front: --skip-pip).
EXTRA_PACKAGES = (f"home-assistant-frontend=={HA_FRONTEND}", "ical==9.1.0")  # frontend, local_calendar
# aiodns 3.2.0 (pinned by HA) crashes with pycares 5; ical 9.1.0 cannot read its own .ics back with pyparsing 3.3
# (local_calendar fails after every HA restart: "'list' object has no attribute 'lower'").
EXTRA_CONSTRAINTS = ("pycares<5", "pyparsing<3.3")
MIN_PYTHON = (3, 13, 0)
RESTART_EXIT_CODE = 100  # `hass` exits with this on homeassistant.restart; the supervisor starts it again
PROGRESS_EVERY_S = 10.0  # a first install takes ~90 s: a progress line this often, never a silent minute

HERE = Path(__file__).resolve().parent
FARM_CONFIG = HERE / "farm"  # configuration.yaml (+ dashboards/) copied into every fresh config dir
PORT_PLACEHOLDER = "__HA_PORT__"

# The seeded owner and its long-lived token: fixed ids so the token is reproducible; the config dir is per run.
ADMIN_USERNAME = "farmadmin"
# farmhost's own HA user (admin, not owner): its token is HA_TOKEN, so people's changes are told from its own.
FARMHOST_USER_NAME = "farmhost"
TOKEN_LIFESPAN_S = 10 * 365 * 86400

Log = Callable[[str], None]


class HaSetupError(RuntimeError):
    """Home Assistant could not be installed or started; the message says why and what to do."""


def _stderr(msg: str) -> None:
    print(f"[ha {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- install


def cache_dir() -> Path:
    """Where the venv, uv cache and install log live: outside the checkout so fresh clones reuse them."""
    default = Path.home() / ".cache" / "farmhost-ha"
    return Path(os.environ.get("FARMHOST_HA_CACHE") or default).expanduser()


def venv_dir() -> Path:
    """The cached venv of this HA version."""
    return cache_dir() / f"venv-{HA_VERSION}"


def venv_python() -> Path:
    """The interpreter of that venv."""
    return venv_dir() / "bin" / "python"


def find_python() -> str:
    """A Python >= 3.13.0 for HA's venv: $FARMHOST_HA_PYTHON, pyenv's 3.13.0, or python3.13 on PATH."""
    candidates: list[str] = []
    if explicit := os.environ.get("FARMHOST_HA_PYTHON"):
        candidates.append(explicit)
    if shutil.which("pyenv"):
        found = subprocess.run(
            ["pyenv", "which", "python3.13"],
            env={**os.environ, "PYENV_VERSION": "3.13.0"},
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode == 0 and found.stdout.strip():
            candidates.append(found.stdout.strip())
    if on_path := shutil.which("python3.13"):
        candidates.append(on_path)
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and tuple(int(x) for x in probe.stdout.split()) >= MIN_PYTHON:
            return candidate
    raise HaSetupError(
        f"Home Assistant {HA_VERSION} needs Python >= 3.13.0 with venv, and none was found "
        f"(tried: {', '.join(candidates) or 'FARMHOST_HA_PYTHON, pyenv 3.13.0, python3.13 on PATH'}). "
        "Get one with `pyenv install 3.13.0` (pyenv builds it from source), or `apt-get install python3.13 "
        "python3.13-venv` on Debian 13, or point FARMHOST_HA_PYTHON at a python3.13 binary."
    )


def installed_version() -> str | None:
    """`hass --version` of the cached venv, or None when there is no complete venv."""
    python = venv_python()
    if not python.exists() or not (venv_dir() / ".farmhost-complete").exists():
        return None
    done = subprocess.run(
        [str(python), "-m", "homeassistant", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pytest sessions on one machine install once
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(log: Log = _stderr) -> Path:
    """Make sure the cached venv has homeassistant==HA_VERSION; returns its python. Idempotent, locked."""
    if installed_version() == HA_VERSION:
        return venv_python()
    with _install_lock():
        if installed_version() == HA_VERSION:  # another process finished it while we waited
            return venv_python()
        _install_fresh(log)
    return venv_python()


def _install_fresh(log: Log) -> None:
    python = find_python()
    venv, root = venv_dir(), cache_dir()
    install_log = root / f"install-{HA_VERSION}.log"
    env = {**os.environ, "UV_CACHE_DIR": str(root / "uv-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.monotonic()
    log(f"installing homeassistant=={HA_VERSION} into {venv} with {python} (log: {install_log}); about a minute")
    shutil.rmtree(venv, ignore_errors=True)
    uv = [str(venv / "bin" / "uv"), "pip", "install", "--python", str(venv / "bin" / "python"), "-q"]
    constraints = root / f"constraints-{HA_VERSION}.txt"
    steps: list[tuple[str, list[str]]] = [
        ("venv", [python, "-m", "venv", str(venv)]),
        ("uv", [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", UV_BOOTSTRAP]),
        ("homeassistant wheel (for its package_constraints.txt)", [*uv, "--no-deps", f"homeassistant=={HA_VERSION}"]),
    ]
    with open(install_log, "w") as out:
        for what, cmd in steps:
            _run_step(what, cmd, env, out, log)
        site = next(venv.glob("lib/python3*/site-packages"))
        pinned = (site / "homeassistant" / "package_constraints.txt").read_text()
        constraints.write_text(pinned + "\n" + "\n".join(EXTRA_CONSTRAINTS) + "\n")
        everything = [
            *uv,
            "--compile-bytecode",
            f"homeassistant=={HA_VERSION}",
            *EXTRA_PACKAGES,
            "-c",
            str(constraints),
        ]
        _run_step("homeassistant + frontend + ical with HA's constraints, bytecode compiled", everything, env, out, log)
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "homeassistant", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if version != HA_VERSION:
        raise HaSetupError(
            f"installed venv reports homeassistant {version!r}, expected {HA_VERSION}; see {install_log}"
        )
    (venv / ".farmhost-complete").write_text(f"{HA_VERSION}\n")
    log(f"installed homeassistant {HA_VERSION} in {time.monotonic() - started:.1f} s")


def _run_step(what: str, cmd: list[str], env: dict[str, str], out: Any, log: Log) -> None:
    """Run one install step into the install log; a progress line every PROGRESS_EVERY_S while it runs."""
    log(f"  {what} ...")
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            try:
                returncode = proc.wait(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                log(f"    ... {time.monotonic() - started:.0f} s, {_packages_installed()} packages in the venv so far")
    except BaseException:  # Ctrl-C or a signal: the step must not go on installing behind our back
        proc.kill()
        proc.wait()
        raise
    if returncode != 0:
        out.flush()
        tail = Path(out.name).read_text().splitlines()[-30:]
        raise HaSetupError(f"HA install step '{what}' failed ({returncode}):\n" + "\n".join(tail))


def _packages_installed() -> int:
    """How many distributions the venv has (uv links them in as it goes): the install's progress figure."""
    return sum(1 for _ in venv_dir().glob("lib/python3*/site-packages/*.dist-info"))


# --------------------------------------------------------------------------------------------- config + auth


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_jwt(claims: dict[str, Any], key: str) -> str:
    """A JWT signed like homeassistant.auth.AuthManager.async_create_access_token does (HS256)."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


def _write_store(storage: Path, key: str, version: int, minor: int, data: dict[str, Any]) -> None:
    path = storage / key
    path.write_text(json.dumps({"version": version, "minor_version": minor, "key": key, "data": data}, indent=2))
    path.chmod(0o600)


@dataclass(frozen=True, kw_only=True)
class SeededAuth:
    """The two seeded users' long-lived tokens: the owner (a person at the farm) and farmhost's own user."""

    owner_token: str
    farmhost_token: str
    farmhost_user_id: str


def _user(user_id: str, name: str, *, owner: bool) -> dict[str, Any]:
    return {
        "id": user_id,
        "group_ids": ["system-admin"],
        "is_owner": owner,
        "is_active": True,
        "name": name,
        "system_generated": False,
        "local_only": False,
    }


def _refresh_token(token_id: str, user_id: str, client: str, jwt_key: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "user_id": user_id,
        "client_id": None,
        "client_name": client,
        "client_icon": None,
        "token_type": "long_lived_access_token",
        "created_at": datetime.now(UTC).isoformat(),
        "access_token_expiration": float(TOKEN_LIFESPAN_S),
        "token": secrets.token_hex(64),
        "jwt_key": jwt_key,
        "last_used_at": None,
        "last_used_ip": None,
        "expire_at": None,
        "credential_id": None,
        "version": None,
    }


def seed_auth(config_dir: Path) -> SeededAuth:
    """Pre-seed `.storage` with an owner, farmhost's own admin user, a long-lived token each and finished onboarding.

    The owner stands for the people of the farm (the tests' `call_service`, the demo's browser); farmhost gets a
    user of its own, as docs/security.md asks of every install, so that HA's contexts tell its changes from theirs.
    The storage layout is HA's internal one (auth 1.1, onboarding 4.1) as of 2025.4.4: with it the tokens work on
    the first request, with no onboarding round trips and none of onboarding's side effects (met, radio_browser...).
    """
    storage = config_dir / ".storage"
    storage.mkdir(parents=True, exist_ok=True)
    user_id, credential_id, token_id = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(16)
    farmhost_id, farmhost_token_id = secrets.token_hex(16), secrets.token_hex(16)
    jwt_key, farmhost_key = secrets.token_hex(64), secrets.token_hex(64)
    auth = {
        "users": [_user(user_id, "Farm admin", owner=True), _user(farmhost_id, FARMHOST_USER_NAME, owner=False)],
        "groups": [
            {"id": "system-admin", "name": "Administrators"},
            {"id": "system-users", "name": "Users"},
            {"id": "system-read-only", "name": "Read Only"},
        ],
        "credentials": [
            {
                "id": credential_id,
                "user_id": user_id,
                "auth_provider_type": "homeassistant",
                "auth_provider_id": None,
                "data": {"username": ADMIN_USERNAME},
            }
        ],
        "refresh_tokens": [
            _refresh_token(token_id, user_id, "farmhost-tests", jwt_key),
            _refresh_token(farmhost_token_id, farmhost_id, "farmhost", farmhost_key),
        ],
    }
    _write_store(storage, "auth", 1, 1, auth)
    _write_store(storage, "onboarding", 4, 1, {"done": ["user", "core_config", "analytics", "integration"]})
    issued = int(time.time()) - 60

    def jwt(token_id: str, key: str) -> str:
        return hs256_jwt({"iss": token_id, "iat": issued, "exp": issued + TOKEN_LIFESPAN_S}, key)

    return SeededAuth(
        owner_token=jwt(token_id, jwt_key),
        farmhost_token=jwt(farmhost_token_id, farmhost_key),
        farmhost_user_id=farmhost_id,
    )


def write_config(config_dir: Path, port: int) -> None:
    """Copy the farm configuration (farmhost/localha/farm/) into `config_dir`, with the HTTP port filled in."""
    for src in sorted(FARM_CONFIG.rglob("*")):
        dst = config_dir / src.relative_to(FARM_CONFIG)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif src.suffix in (".yaml", ".yml"):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(src.read_text().replace(PORT_PLACEHOLDER, str(port)))


# --------------------------------------------------------------------------------------------- the farm


@dataclass(frozen=True)
class FarmEntity:
    """An entity the farm configuration must create, with what a test may rely on."""

    entity_id: str
    device_class: str | None = None
    unit: str | None = None
    driver: str | None = None  # the helper whose value the entity follows (set it to drive the entity)


FARM_ENTITIES: tuple[FarmEntity, ...] = (
    # helpers: the knobs tests turn
    FarmEntity("input_number.field_1_soil_moisture_raw", unit="%"),
    FarmEntity("input_number.field_2_soil_moisture_raw", unit="%"),
    FarmEntity("input_number.air_temperature_raw", unit="°C"),
    FarmEntity("input_number.air_humidity_raw", unit="%"),
    FarmEntity("input_number.irrigation_duration_raw", unit="min"),
    FarmEntity("input_boolean.pump_relay"),
    FarmEntity("input_boolean.field_1_valve_relay"),
    FarmEntity("input_boolean.field_2_valve_relay"),
    FarmEntity("input_boolean.pump_fault_sim"),
    FarmEntity("input_boolean.barn_light_relay"),
    FarmEntity("input_boolean.greenhouse_fan_relay"),
    FarmEntity("input_select.irrigation_mode"),
    FarmEntity("input_select.fertigation_program_raw"),
    FarmEntity("input_select.weather_condition_raw"),
    # the farm as an agent sees it
    FarmEntity("sensor.field_1_soil_moisture", "moisture", "%", "input_number.field_1_soil_moisture_raw"),
    FarmEntity("sensor.field_2_soil_moisture", "moisture", "%", "input_number.field_2_soil_moisture_raw"),
    FarmEntity("sensor.air_temperature", "temperature", "°C", "input_number.air_temperature_raw"),
    FarmEntity("sensor.air_humidity", "humidity", "%", "input_number.air_humidity_raw"),
    FarmEntity("binary_sensor.frost_risk", "cold", None, "input_number.air_temperature_raw"),
    FarmEntity("binary_sensor.pump_fault", "problem", None, "input_boolean.pump_fault_sim"),
    FarmEntity("switch.irrigation_pump", driver="input_boolean.pump_relay"),
    FarmEntity("switch.field_1_valve", driver="input_boolean.field_1_valve_relay"),
    FarmEntity("switch.field_2_valve", driver="input_boolean.field_2_valve_relay"),
    FarmEntity("light.barn_light", driver="input_boolean.barn_light_relay"),
    FarmEntity("fan.greenhouse_fan", driver="input_boolean.greenhouse_fan_relay"),
    FarmEntity("number.irrigation_duration", unit="min", driver="input_number.irrigation_duration_raw"),
    FarmEntity("select.fertigation_program", driver="input_select.fertigation_program_raw"),
    FarmEntity("weather.farm_weather", driver="input_select.weather_condition_raw"),
    FarmEntity("calendar.farm", driver=None),  # local_calendar, created through the config-flow API at start
)
FARM_ENTITY_IDS = tuple(e.entity_id for e in FARM_ENTITIES)

# The value of every helper right after start (the `initial:` of configuration.yaml); `reset()` restores them.
FARM_DEFAULTS: dict[str, float | str] = {
    "input_number.field_1_soil_moisture_raw": 45.0,
    "input_number.field_2_soil_moisture_raw": 38.0,
    "input_number.air_temperature_raw": 14.5,
    "input_number.air_humidity_raw": 65.0,
    "input_number.irrigation_duration_raw": 30.0,
    "input_boolean.pump_relay": "off",
    "input_boolean.field_1_valve_relay": "off",
    "input_boolean.field_2_valve_relay": "off",
    "input_boolean.pump_fault_sim": "off",
    "input_boolean.barn_light_relay": "off",
    "input_boolean.greenhouse_fan_relay": "off",
    "input_select.irrigation_mode": "auto",
    "input_select.fertigation_program_raw": "none",
    "input_select.weather_condition_raw": "partlycloudy",
}
# The simulator's helpers: the knobs behind the farm, not something a farmer talks about.
SIM_DOMAINS: frozenset[str] = frozenset({"input_number", "input_boolean", "input_select"})
# What a farmer says for an entity, beside its name (Assist matches names and aliases, e.g. "what is the {name}").
ASSIST_ALIASES: dict[str, tuple[str, ...]] = {
    "sensor.field_1_soil_moisture": ("soil moisture of field 1", "field 1 moisture"),
    "sensor.field_2_soil_moisture": ("soil moisture of field 2", "field 2 moisture"),
    "switch.irrigation_pump": ("pump", "water pump"),
}
CALENDAR_NAME = "Farm"
CALENDAR_ENTITY = "calendar.farm"


# --------------------------------------------------------------------------------------------- HTTP + WebSocket


class HaHttpError(RuntimeError):
    """HA answered a REST call with an error status."""

    def __init__(self, status: int, body: str, path: str) -> None:
        super().__init__(f"HA {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def http_json(method: str, url: str, token: str | None, body: Any = None, timeout: float = 10.0) -> Any:
    """One REST call with a JSON body and answer; raises HaHttpError on 4xx/5xx, OSError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        with err:
            raise HaHttpError(err.code, err.read().decode(errors="replace"), url) from None
    return json.loads(raw) if raw else None


class WsSession:
    """A minimal HA WebSocket client (RFC 6455 text frames, stdlib): authenticates, then sends commands."""

    def __init__(self, ws_url: str, token: str, timeout: float = 10.0) -> None:
        host_port = ws_url.split("//", 1)[1].split("/", 1)[0]
        host, _, port = host_port.partition(":")
        self._sock = socket.create_connection((host, int(port or 80)), timeout=timeout)
        self._next_id = 1
        try:
            self._handshake(host_port, "/" + ws_url.split("//", 1)[1].split("/", 1)[1])
            hello = self.recv()
            if hello.get("type") != "auth_required":
                raise HaSetupError(f"unexpected WebSocket greeting {hello}")
            self.send({"type": "auth", "access_token": token})
            self.auth = self.recv()  # {"type": "auth_ok" | "auth_invalid", ...}
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, host_port: str, path: str) -> None:
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        self._sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ConnectionError("WebSocket handshake: connection closed")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"WebSocket handshake refused: {status.decode(errors='replace')}")
        self._buffer = head.split(b"\r\n\r\n", 1)[1]

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("WebSocket closed by HA")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def send(self, message: dict[str, Any]) -> None:
        """Send one JSON message (a masked text frame)."""
        payload = json.dumps(message).encode()
        header = bytearray([0x81])  # FIN + text
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", len(payload))
        mask = secrets.token_bytes(4)
        self._sock.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> dict[str, Any]:
        """The next JSON message from HA."""
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("WebSocket closed by HA")
            if opcode in (0x9, 0xA):  # ping/pong: HA does not ping a client that talks; ignore
                continue
            message += payload
            if first & 0x80:
                result: dict[str, Any] = json.loads(message)
                return result

    def command(self, type_: str, **payload: Any) -> dict[str, Any]:
        """Send one command and return HA's `result` message (`success`, `result` or `error`)."""
        msg_id, self._next_id = self._next_id, self._next_id + 1
        self.send({"id": msg_id, "type": type_, **payload})
        while True:
            answer = self.recv()
            if answer.get("id") == msg_id and answer.get("type") == "result":
                return answer

    def close(self) -> None:
        """Say goodbye (a close frame) and close the socket."""
        with contextlib.suppress(OSError):
            self._sock.sendall(b"\x88\x82" + b"\x00\x00\x00\x00" + struct.pack("!H", 1000))
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------- the instance


class HaInstance:
    """One Home Assistant in its own config dir and port, under a supervisor that restarts `hass` on exit 100."""

    def __init__(self, root: Path, *, port: int | None = None, log: Log = _stderr) -> None:
        self.root = root
        self.config_dir = root / "config"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/api/websocket"
        self.token = ""  # the owner's: a person's calls (call_service, set_state, the browser)
        self.farmhost_token = ""  # farmhost's own user's: what env() gives farmhost as HA_TOKEN
        self.log_path = root / "hass.log"
        self._log = log
        self._supervisor: subprocess.Popen[bytes] | None = None

    # ---- lifecycle

    def prepare(self) -> None:
        """Write a fresh config dir: the farm configuration, the seeded owner and farmhost's user, with tokens."""
        shutil.rmtree(self.config_dir, ignore_errors=True)
        self.config_dir.mkdir(parents=True)
        write_config(self.config_dir, self.port)
        seeded = seed_auth(self.config_dir)
        self.token, self.farmhost_token = seeded.owner_token, seeded.farmhost_token

    def start(self, *, timeout: float = 60.0, watch_parent: bool = True) -> float:
        """Start HA under the supervisor and wait until it is RUNNING; returns the seconds it took."""
        if self.running():
            return 0.0
        if not self.token:
            self.prepare()
        python = venv_python()
        if not python.exists():
            raise HaSetupError(
                f"no HA venv at {venv_dir()}: run `.venv/bin/python -m farmhost.localha.harness install`"
            )
        started = time.monotonic()
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "supervise",
            "--python",
            str(python),
            "--config",
            str(self.config_dir),
            "--log",
            str(self.log_path),
            "--pid-file",
            str(self.root / "hass.pid"),
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
        if not self.running():
            self.start(timeout=timeout)
        elif self.core_state() != "RUNNING":
            self.wait_running(timeout=timeout)

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM to the supervisor (it stops hass); KILL the process group only if that hangs. Returns hass's rc."""
        proc, self._supervisor = self._supervisor, None
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

    # ---- after start: the calendar and the entity check

    def setup_farm(self) -> None:
        """Create what YAML cannot: the local calendar (config flow) with two events; then check every entity."""
        flow = self.api("POST", "/api/config/config_entries/flow", {"handler": "local_calendar"})
        done = self.api("POST", f"/api/config/config_entries/flow/{flow['flow_id']}", {"calendar_name": CALENDAR_NAME})
        if done.get("type") != "create_entry":
            raise HaSetupError(f"local_calendar config flow did not create an entry: {done}")
        self.wait_entities([CALENDAR_ENTITY], timeout=10)
        now = int(time.time())
        for summary, start_in_h, hours in (("Irrigate field 1", 2, 1), ("Fertigation (bloom)", 26, 2)):
            self.call_service(
                "calendar",
                "create_event",
                {
                    "entity_id": CALENDAR_ENTITY,
                    "summary": summary,
                    "start_date_time": _local_iso(now + start_in_h * 3600),
                    "end_date_time": _local_iso(now + (start_in_h + hours) * 3600),
                },
            )
        self.check_entities()
        self.expose_to_assist()

    def expose_to_assist(self) -> None:
        """Expose the farm's own entities (not the sim helpers) to Assist, with the aliases farmers say (ASSIST_ALIASES).

        HA exposes only some domains by default (switch, light, fan, not moisture sensors, numbers or selects), so
        "what is the soil moisture of field 1" would find nothing without this.
        """
        exposed = [e.entity_id for e in FARM_ENTITIES if e.entity_id.split(".", 1)[0] not in SIM_DOMAINS]
        with self.ws() as ws:
            answer = ws.command(
                "homeassistant/expose_entity", assistants=["conversation"], entity_ids=exposed, should_expose=True
            )
            if not answer.get("success"):
                raise HaSetupError(f"exposing the farm to Assist failed: {answer.get('error')}")
            for entity_id, aliases in ASSIST_ALIASES.items():
                answer = ws.command("config/entity_registry/update", entity_id=entity_id, aliases=list(aliases))
                if not answer.get("success"):
                    raise HaSetupError(f"setting the Assist aliases of {entity_id} failed: {answer.get('error')}")

    def wait_entities(self, entity_ids: list[str], *, timeout: float) -> None:
        """Wait until HA has all these entities."""
        deadline = time.monotonic() + timeout
        while missing := sorted(set(entity_ids) - {s["entity_id"] for s in self.get_states()}):
            if time.monotonic() > deadline:
                raise HaSetupError(f"entities missing after {timeout} s: {missing}\n{self.log_tail()}")
            time.sleep(0.1)

    def hide_from_assist(self, entity_ids: list[str]) -> None:
        """Un-expose these entities from Assist (the demo does it for those its farm profile limits)."""
        if not entity_ids:
            return
        with self.ws() as ws:
            answer = ws.command(
                "homeassistant/expose_entity", assistants=["conversation"], entity_ids=entity_ids, should_expose=False
            )
            if not answer.get("success"):
                raise HaSetupError(f"un-exposing {', '.join(entity_ids)} from Assist failed: {answer.get('error')}")

    def check_entities(self) -> None:
        """Fail loudly, listing every farm entity that is missing or has the wrong device_class/unit."""
        states = {s["entity_id"]: s for s in self.get_states()}
        problems = []
        for entity in FARM_ENTITIES:
            state = states.get(entity.entity_id)
            if state is None:
                problems.append(f"{entity.entity_id}: missing")
                continue
            attrs = state["attributes"]
            if entity.device_class is not None and attrs.get("device_class") != entity.device_class:
                problems.append(f"{entity.entity_id}: device_class {attrs.get('device_class')!r}")
            if entity.unit is not None and attrs.get("unit_of_measurement") != entity.unit:
                problems.append(f"{entity.entity_id}: unit {attrs.get('unit_of_measurement')!r}")
            if state["state"] in ("unavailable", "unknown") and not entity.entity_id.startswith("calendar."):
                problems.append(f"{entity.entity_id}: state {state['state']!r}")
        if problems:
            raise HaSetupError(
                "the farm configuration is incomplete:\n  " + "\n  ".join(problems) + "\n" + self.log_tail()
            )

    # ---- REST helpers

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 10.0) -> Any:
        """One authenticated REST call (`path` starts with /api or /auth); the decoded JSON answer."""
        return http_json(method, self.url + path, self.token, body, timeout)

    def ws(self) -> WsSession:
        """A new authenticated WebSocket session (use as a context manager)."""
        return WsSession(self.ws_url, self.token)

    def get_states(self) -> list[dict[str, Any]]:
        """Every entity state (REST /api/states)."""
        states: list[dict[str, Any]] = self.api("GET", "/api/states")
        return states

    def get_state(self, entity_id: str) -> dict[str, Any]:
        """The raw state dict; raises HaHttpError(404) for an unknown entity."""
        state: dict[str, Any] = self.api("GET", f"/api/states/{entity_id}")
        return state

    def call_service(self, domain: str, service: str, data: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Call a service; returns the states it changed."""
        changed: list[dict[str, Any]] = self.api("POST", f"/api/services/{domain}/{service}", data or {})
        return changed

    def set_number(self, entity_id: str, value: float) -> None:
        """input_number/number set_value; a driven sensor id (sensor.air_temperature...) sets its input_number."""
        entity_id = DRIVERS.get(entity_id, entity_id)
        self.call_service(entity_id.split(".", 1)[0], "set_value", {"entity_id": entity_id, "value": value})

    def set_state(self, entity_id: str, value: bool | float | str) -> None:
        """Drive an entity through its service, the way a person would (driven entities go through their helper).

        input_number/number: set_value; input_boolean/switch/light/fan: True/False or "on"/"off";
        input_select/select: the option. For anything else use `write_state` (raw state machine write).
        """
        entity_id = DRIVERS.get(entity_id, entity_id)
        domain = entity_id.split(".", 1)[0]
        if domain in ("input_number", "number"):
            self.set_number(entity_id, float(value))
        elif domain in ("input_boolean", "switch", "light", "fan"):
            on = value if isinstance(value, bool) else str(value).lower() == "on"
            self.call_service(domain, "turn_on" if on else "turn_off", {"entity_id": entity_id})
        elif domain in ("input_select", "select"):
            self.call_service(domain, "select_option", {"entity_id": entity_id, "option": str(value)})
        else:
            raise ValueError(f"set_state does not drive {domain} entities; use write_state")

    def write_state(self, entity_id: str, state: str, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST /api/states: overwrite (or create) a state in HA's state machine only; gone after a restart."""
        written: dict[str, Any] = self.api(
            "POST", f"/api/states/{entity_id}", {"state": state, "attributes": attributes or {}}
        )
        return written

    def reset(self) -> None:
        """Put every helper back to its start value (FARM_DEFAULTS), so each test sees the same farm."""
        found = self.get_states()
        # Scenes a test made with scene.create (no `id`: not from the configuration) would stay, exposed to Assist.
        for scene in found:
            if scene["entity_id"].startswith("scene.") and "id" not in (scene.get("attributes") or {}):
                self.call_service("scene", "delete", {"entity_id": scene["entity_id"]})
        states = {s["entity_id"]: s["state"] for s in found}
        for entity_id, value in FARM_DEFAULTS.items():
            current = states.get(entity_id)
            if current is not None and _same(current, value):
                continue
            self.set_state(entity_id, value)

    def env(self) -> dict[str, str]:
        """HA_URL and HA_TOKEN (farmhost's own user's token, not the owner's) for a farmhost talking to this instance."""
        return {"HA_URL": self.url, "HA_TOKEN": self.farmhost_token}


# Driven entity -> its helper (so tests can say set_number("sensor.air_temperature", 1.0)).
DRIVERS: dict[str, str] = {
    e.entity_id: e.driver
    for e in FARM_ENTITIES
    if e.driver is not None and e.entity_id.startswith(("sensor.", "binary_"))
}


def _same(current: str, wanted: float | str) -> bool:
    if isinstance(wanted, float):
        with contextlib.suppress(ValueError):
            return float(current) == wanted
        return False
    return current == wanted


def _local_iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).astimezone().replace(microsecond=0).isoformat()


def start_session_instance(root: Path, *, log: Log = _stderr, watch_parent: bool = True) -> HaInstance:
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


# --------------------------------------------------------------------------------------------- supervisor


def supervise(python: str, config: str, log_path: str, pid_file: str, parent: int | None) -> int:
    """Run `hass` until it exits with something other than 100; forward SIGTERM/SIGINT; die with the parent."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run_dir = Path(pid_file).parent
    with open(log_path, "ab") as log:
        while True:
            log.write(f"### supervisor: starting hass ({time.strftime('%H:%M:%S')})\n".encode())
            log.flush()
            child = subprocess.Popen(
                [python, "-m", "homeassistant", "-c", config, "--skip-pip", "--log-no-color"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            Path(pid_file).write_text(f"{child.pid}\n")
            while child.poll() is None:
                orphaned = parent is not None and os.getppid() != parent
                if stopping or orphaned:
                    child.terminate()
                    try:
                        child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
                    break
                time.sleep(0.1)
            rc = child.returncode
            (run_dir / "hass.rc").write_text(f"{rc}\n")
            if rc != RESTART_EXIT_CODE or stopping:
                log.write(f"### supervisor: hass exited {rc}, done\n".encode())
                return 0 if stopping else rc
            log.write(b"### supervisor: hass exited 100 (restart requested): starting it again\n")


# --------------------------------------------------------------------------------------------- command line


def _default_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"farmhost-ha-{os.environ.get('USER', 'user')}"


def _read_pid(path: Path) -> int | None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(path.read_text())
        os.kill(pid, 0)
        return pid
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line: install, start, status, stop, supervise."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="create or refresh the cached HA venv")
    for name in ("start", "stop", "status"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=_default_dir(), help="instance dir (config/, hass.log, ha.env)")
    sup = sub.add_parser("supervise", help=argparse.SUPPRESS)
    sup.add_argument("--python", required=True)
    sup.add_argument("--config", required=True)
    sup.add_argument("--log", required=True)
    sup.add_argument("--pid-file", required=True)
    sup.add_argument("--parent", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "supervise":
            return supervise(args.python, args.config, args.log, args.pid_file, args.parent)
        if args.command == "install":
            started = time.monotonic()
            install()
            _stderr(f"homeassistant {installed_version()} ready in {venv_dir()} ({time.monotonic() - started:.1f} s)")
            return 0
        root: Path = args.dir
        pid = _read_pid(root / "supervisor.pid")
        if args.command == "status":
            if pid is None:
                print("not running")
                return 1
            print((root / "ha.env").read_text(), end="")
            return 0
        if args.command == "stop":
            if pid is None:
                _stderr("not running")
                return 0
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _read_pid(root / "supervisor.pid") is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if _read_pid(root / "supervisor.pid") is not None:
                os.killpg(pid, signal.SIGKILL)
            (root / "supervisor.pid").unlink(missing_ok=True)
            _stderr(f"stopped (hass exit code {(root / 'hass.rc').read_text().strip()})")
            return 0
        if pid is not None:
            _stderr(f"already running (supervisor {pid}); see {root / 'ha.env'}")
            return 0
        root.mkdir(parents=True, exist_ok=True)
        instance = start_session_instance(root, watch_parent=False)
        instance._supervisor = None  # detached: it outlives this command; `stop` uses supervisor.pid
        env = {
            **instance.env(),
            "HA_OWNER_TOKEN": instance.token,
            "HA_WS_URL": instance.ws_url,
            "HA_CONFIG_DIR": str(instance.config_dir),
        }
        (root / "ha.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        _stderr(f"env in {root / 'ha.env'}; log in {instance.log_path}")
        return 0
    except HaSetupError as err:
        _stderr(f"error: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
