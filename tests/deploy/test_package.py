"""The wheels `uv build` makes: installed into a fresh virtualenv, farmhost works with no source checkout anywhere.

One build of both wheels (farmhost, which carries the agent package, and farmagent for the agent image) and one
install of farmhost's wheel into a new virtualenv are shared by the module, with uv's cache (nothing is
downloaded when the cache holds the locked versions) and uv.lock's versions as constraints. Every command then
runs that virtualenv's `farmhost` from a directory outside the checkout, with no PYTHONPATH, so the dashboards,
the global memory and farmagent can only come from the installed wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import Daemon, clean_env, scaled

pytestmark = pytest.mark.slow  # a build and an install (~5 s with uv's cache), then real CLI and daemon runs

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".tools" / "bin" / "uv"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SHIPPED = {"dashboards": REPO / "dashboards", "memory": REPO / "memory"}


@dataclass(frozen=True)
class Installed:
    dist: Path  # the wheels
    venv: Path
    work: Path  # the working directory of every command: outside the checkout
    seconds: dict[str, float]  # how long the build and the install took

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def farmhost(self) -> Path:
        return self.venv / "bin" / "farmhost"

    def wheel(self, name: str) -> Path:
        (found,) = self.dist.glob(f"{name}-{VERSION}-py3-none-any.whl")
        return found


def _env() -> dict[str, str]:
    """No farmhost settings, nothing that points Python at the checkout or at another virtualenv."""
    env = clean_env(UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONHOME"):
        env.pop(name, None)
    return env


def _run(*argv: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("package")
    assert REPO not in root.parents
    dist, venv, work = root / "dist", root / "venv", root / "work"
    work.mkdir()
    seconds: dict[str, float] = {}
    started = time.monotonic()
    _run(UV, "build", "--all-packages", "--out-dir", dist, cwd=REPO, timeout=180)
    seconds["build"] = time.monotonic() - started
    started = time.monotonic()
    # The lock's versions (what CI tests everywhere else), taken from uv's cache; farmhost itself from the wheel.
    constraints = root / "constraints.txt"
    _run(UV, "export", "--frozen", "--no-dev", "--no-emit-workspace", "--no-hashes", "-q", "-o", constraints, cwd=REPO)
    _run(UV, "venv", "-q", "--python", sys.executable, venv, cwd=work)
    wheel = next(dist.glob(f"farmhost-{VERSION}-*.whl"))
    _run(
        UV, "pip", "install", "-q", "--python", venv / "bin" / "python", "-c", constraints, wheel, cwd=work, timeout=300
    )
    seconds["install"] = time.monotonic() - started
    yield Installed(dist, venv, work, seconds)


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        parsed = Parser().parsestr(archive.read(metadata).decode())
    return sorted(parsed.get_all("Requires-Dist") or [])


def test_the_wheels_carry_the_agent_package_and_the_shipped_data(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel("farmhost")) as archive:
        names = set(archive.namelist())
        for name, source in SHIPPED.items():
            files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
            assert files, source
            for relative in files:
                packaged = f"farmhost/shipped/{name}/{relative}"
                assert archive.read(packaged) == (source / relative).read_bytes(), packaged
        assert {"farmagent/ipc_contract.json", "farmagent/tool_table.json", "farmagent/run.py"} <= names
        assert "farmhost/localha/farm/configuration.yaml" in names  # the demo's Home Assistant is product code
    # Development tools, tests and benchmarks are not the product.
    assert not [n for n in names if n.split("/")[0] in ("farmhost_dev", "tests", "bench", "container", "docs")]
    with zipfile.ZipFile(installed.wheel("farmagent")) as archive:
        assert {"farmagent/ipc_contract.json", "farmagent/tool_table.json"} <= set(archive.namelist())
    # farmhost's wheel asks for nothing the index cannot give: no `farmagent` requirement, farmagent's own instead.
    farmhost_requires, farmagent_requires = (
        _requires(installed.wheel("farmhost")),
        _requires(installed.wheel("farmagent")),
    )
    assert not [r for r in farmhost_requires if r.split(">")[0].split("<")[0].split("=")[0].strip() == "farmagent"]
    assert set(farmagent_requires) <= set(farmhost_requires), sorted(set(farmagent_requires) - set(farmhost_requires))
    container = tomllib.loads((REPO / "container" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert set(container) <= set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def _send(installed: Installed, data_dir: Path, request: dict[str, Any]) -> dict[str, Any]:
    done = _run(
        installed.farmhost, "ipc", "send", "--data-dir", data_dir, "--group", "main", "--queue", "actions",
        "--json", json.dumps(request), "--timeout", str(scaled(20)), cwd=installed.work,
    )  # fmt: skip
    answer: dict[str, Any] = json.loads(done.stdout)
    assert answer["status"] == "success", answer
    return answer


def test_the_installed_farmhost_runs_outside_the_checkout(installed: Installed) -> None:
    started = time.monotonic()
    probe = (
        "import json, farmhost, farmagent; from farmagent.tool_schemas import action_parameters; "
        "from farmhost.layout import shipped_dir; print(json.dumps([farmhost.__file__, farmagent.__file__, "
        "str(shipped_dir('dashboards')), str(shipped_dir('memory')), action_parameters('memory_search')]))"
    )
    *paths, memory_search = json.loads(_run(installed.python, "-c", probe, cwd=installed.work).stdout)
    for path in paths:
        assert Path(path).is_relative_to(installed.venv), paths
    assert "query" in memory_search["properties"], memory_search  # farmagent's ipc_contract.json was installed
    assert _run(installed.farmhost, "--version", cwd=installed.work).stdout.strip() == f"farmhost {VERSION}"

    data_dir = installed.work / "data"
    _run(installed.farmhost, "init", "--data-dir", data_dir, cwd=installed.work)
    _run(
        installed.farmhost, "group", "add", "--data-dir", data_dir, "--jid", "local:main", "--name", "Farm office",
        "--folder", "main", "--main", cwd=installed.work,
    )  # fmt: skip

    daemon = Daemon(data_dir, env=_env(), python=installed.python).start(timeout=30)
    try:
        # The daemon seeded the global memory from the wheel's copy.
        seeded = data_dir / "groups" / "global" / "MEMORY.md"
        assert seeded.read_bytes() == (REPO / "memory" / "MEMORY.md").read_bytes()
        pong = _send(installed, data_dir, {"type": "ping"})
        assert pong["result"]["pong"] is True and pong["result"]["version"] == VERSION
        dashboard = _send(
            installed, data_dir, {"type": "farm_action", "action": "ha_dashboard_get", "params": {"dashboard": "farm"}}
        )["result"]
        assert dashboard["dashboard"] == "farm" and dashboard["title"] == "Farm", dashboard
        assert [v["path"] for v in dashboard["views"]] == ["overview", "irrigation", "alerts"], dashboard
        found = _send(
            installed,
            data_dir,
            {"type": "memory_action", "action": "memory_search", "params": {"query": "irrigation pump"}},
        )["result"]["hits"]
        global_hits = [h for h in found if h["groupFolder"] == "global"]
        assert global_hits and "switch.irrigation_pump" in global_hits[0]["snippet"], found
        assert global_hits[0]["path"] in {
            "MEMORY.md",
            *(f"memory/{p.name}" for p in (REPO / "memory" / "memory").iterdir()),
        }
    finally:
        code = daemon.stop() if daemon.proc is not None else 0
    assert code == 0, daemon.log()
    # Measured, for docs/testing.md: the build, the install and this test's commands.
    print(f"\npackage test: {installed.seconds} commands {time.monotonic() - started:.1f} s", file=sys.stderr)
