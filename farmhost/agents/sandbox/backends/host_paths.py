"""What of the host a sandbox needs read-only: the interpreter's prefixes, farmagent's source, the system dirs."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.agents.sandbox.backends.base import SandboxError

# The interpreter answers in well under a second; a hung one must not hold up the daemon's start.
PYTHON_PROBE_TIMEOUT: Final = 20.0
# Top-level directories an interpreter may need (libc, the dynamic loader, /usr/share/zoneinfo). On Debian
# since bookworm all but /usr are symlinks into /usr; a real directory is bound read-only instead.
SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Run by the agent's interpreter: where its installation lives and where `farmagent` is imported from.
_PROBE: Final = """
import importlib.util, json, os, sys
spec = importlib.util.find_spec("farmagent")
package = None
if spec is not None and spec.submodule_search_locations:
    package = os.path.realpath(list(spec.submodule_search_locations)[0])
print(json.dumps({
    "prefixes": sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}),
    "executable": os.path.realpath(sys.executable),
    "farmagent": package,
}))
"""


@dataclass(frozen=True, kw_only=True)
class SystemEntry:
    """A top-level system path: a symlink to re-create, or a directory to bind read-only."""

    path: str
    link: str | None  # the symlink's target, or None for a real directory


@dataclass(frozen=True, kw_only=True)
class PythonInstall:
    """An interpreter and the host directories it needs, all mounted read-only at the same paths."""

    executable: Path  # as configured: a venv's `bin/python` must keep its path to find its `pyvenv.cfg`
    ro_paths: tuple[Path, ...]
    farmagent: Path | None  # the package directory, None when the interpreter cannot import it


def minimal_paths(paths: list[Path]) -> tuple[Path, ...]:
    """The given paths without duplicates and without any that lie inside another one."""
    result: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path == kept or kept in path.parents for kept in result):
            result.append(path)
    return tuple(sorted(result))


def system_entries() -> tuple[SystemEntry, ...]:
    """The system directories present on this host, as symlinks or directories."""
    entries = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            entries.append(SystemEntry(path=path, link=os.readlink(path)))
        elif os.path.isdir(path):
            entries.append(SystemEntry(path=path, link=None))
    return tuple(entries)


def find_python_install_sync(executable: Path | None) -> PythonInstall:
    """Ask the agent's interpreter where it lives (blocking; call it through `asyncio.to_thread`).

    An answer is kept for the process: the interpreter's installation does not change under a running daemon
    (asked once, at its start), and where one process starts several (the test suite's fork server asks once,
    then forks them) the interpreter runs once. A failure is not kept: the next call asks again.

    Args:
        executable: FARMHOST_AGENT_PYTHON, or None for the daemon's own interpreter.

    Raises:
        SandboxError: the interpreter cannot be run or gives no usable answer.
    """
    return _probe(Path(executable or sys.executable))


@functools.cache
def _probe(python: Path) -> PythonInstall:
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PYTHON_PROBE_TIMEOUT,
            env={"PATH": os.defpath},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxError(f"cannot run the agent interpreter {python} (FARMHOST_AGENT_PYTHON): {err}") from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = done.stderr.strip()[-300:]
        raise SandboxError(
            f"the agent interpreter {python} did not describe itself (exit {done.returncode}): {tail}"
        ) from None
    # `-I` ignores PYTHON* variables and the user site, as the sandbox's clean environment does; the .pth files
    # of site-packages (editable installs) still count.
    paths = [Path(p) for p in answer["prefixes"]]
    real = Path(answer["executable"])
    if not any(prefix in real.parents for prefix in paths):
        paths.append(real.parent)
    farmagent = Path(answer["farmagent"]) if answer.get("farmagent") else None
    if farmagent is not None and not any(prefix in farmagent.parents for prefix in paths):
        paths.append(farmagent.parent)  # an editable install: the source directory (container/), nothing above it
    return PythonInstall(executable=python, ro_paths=minimal_paths(paths), farmagent=farmagent)
