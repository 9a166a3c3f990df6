"""The cached Home Assistant venv: which release, where it lives, and installing it once (locked, with progress)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from farmhost.localha.errors import HaSetupError

HA_VERSION: Final = "2025.4.4"  # the newest release whose Requires-Python accepts 3.13.0
HA_FRONTEND: Final = "20250411.0"  # must equal homeassistant/components/frontend/manifest.json of HA_VERSION
UV_BOOTSTRAP: Final = "uv==0.6.10"  # HA 2025.4.4 pins uv==0.6.10 itself; phase 2 keeps it
# Requirements of integrations the farm config loads that are not core dependencies (installed up front: --skip-pip).
EXTRA_PACKAGES: Final = (f"home-assistant-frontend=={HA_FRONTEND}", "ical==9.1.0")  # frontend, local_calendar
# aiodns 3.2.0 (pinned by HA) crashes with pycares 5; ical 9.1.0 cannot read its own .ics back with pyparsing 3.3
# (local_calendar fails after every HA restart: "'list' object has no attribute 'lower'").
EXTRA_CONSTRAINTS: Final = ("pycares<5", "pyparsing<3.3")
MIN_PYTHON: Final = (3, 13, 0)  # HA_VERSION's Requires-Python
PROGRESS_EVERY_S: Final = 10.0  # a first install takes ~90 s: a progress line this often, never a silent minute

Log = Callable[[str], None]


def log_to_stderr(msg: str) -> None:
    """The default progress line: `[ha HH:MM:SS] msg` on stderr."""
    print(f"[ha {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
    """The homeassistant release installed in the cached venv, or None when there is no complete venv.

    Read from the package's metadata in the venv (`homeassistant-<version>.dist-info`), not by running
    `hass --version`: that interpreter start cost 0.6-1.5 s on every demo start and test session.
    """
    python = venv_python()
    if not python.exists() or not (venv_dir() / ".farmhost-complete").exists():
        return None
    found = [
        dist.version
        for site in venv_dir().glob("lib/python3*/site-packages")
        if (site / "homeassistant" / "__main__.py").is_file()
        for dist in importlib.metadata.distributions(name="homeassistant", path=[str(site)])
    ]
    return found[0] if len(found) == 1 else None


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two pytest sessions on one machine install once
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install(log: Log = log_to_stderr) -> Path:
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
