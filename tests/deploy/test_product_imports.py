"""What the product imports: never tests/ (the tests' tooling it needs is in farmhost_dev/), never the local HA.

Read from the sources (the imports and sys.path edits the interpreter would run), so a new `from llm_stub import`
in bench/ or a `sys.path.insert(..., "tests")` in farmhost/ fails here, not on a machine without the checkout.
The local Home Assistant (farmhost.localha: the demo's and the tests' HA, with aiohttp sessions and a process
supervisor) is for `farmhost demo` only: the daemon and the other commands neither import nor load it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from farmhost_testing import clean_env

REPO = Path(__file__).resolve().parents[2]
TEST_MODULES = {p.stem for p in (REPO / "tests").glob("*.py")} | {"tests"}  # farmhost_testing, llm_stub, ...


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip("/") == "tests":
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: the path 'tests'")
            continue
        else:
            continue
        found += [
            f"{path.relative_to(REPO)}:{node.lineno}: import {n}" for n in names if n.split(".")[0] in TEST_MODULES
        ]
    return found


def test_farmhost_bench_and_farmhost_dev_import_nothing_from_tests() -> None:
    sources = [p for top in ("farmhost", "bench", "farmhost_dev") for p in sorted((REPO / top).rglob("*.py"))]
    assert len(sources) > 100
    offences = [line for path in sources for line in _offences(path)]
    assert not offences, "\n".join(offences)
    # farmhost_dev is importable without pytest (bench/ runs without the dev group's test tools).
    for path in sorted((REPO / "farmhost_dev").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m.split(".")[0] in ("pytest", "_pytest")}, path


def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports anywhere (module level or inside a function), absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    names |= {  # `from farmhost.localha import instance`
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
        for a in n.names
    }
    return names


def test_only_the_demo_imports_the_local_home_assistant() -> None:
    allowed = (REPO / "farmhost" / "localha", REPO / "farmhost" / "demo")
    sources = [p for p in sorted((REPO / "farmhost").rglob("*.py")) if not p.is_relative_to(allowed[0])]
    offences = [
        f"{path.relative_to(REPO)}: import {name}"
        for path in sources
        if not path.is_relative_to(allowed[1])
        for name in sorted(_imported_modules(path))
        if name == "farmhost.localha" or name.startswith("farmhost.localha.")
    ]
    assert not offences, "\n".join(offences)
    # Inside farmhost/demo only the HA wrapper the runner builds on imports it; the runner is imported lazily.
    demo = sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "farmhost" / "demo").glob("*.py")
        if any(n.startswith("farmhost.localha") for n in _imported_modules(path))
    )
    assert demo == ["farmhost/demo/ha.py"]


PROBE = """
import asyncio, pkgutil, sys
from pathlib import Path

import farmhost.cli
from farmhost.app import App
from farmhost.config import Settings

for module in pkgutil.iter_modules(farmhost.cli.__path__, "farmhost.cli."):
    __import__(module.name)
farmhost.cli.build_parser()


async def main() -> None:
    app = App(Settings(_env_file=None, FARMHOST_DATA_DIR=Path(sys.argv[1])))
    await app.start()
    await app.stop()

asyncio.run(main())
print(sorted(m for m in sys.modules if m == "farmhost.localha" or m.startswith(("farmhost.localha.", "farmhost.demo.ha"))))
"""


def test_the_command_line_and_a_running_daemon_never_load_the_local_home_assistant(data_dir: Path) -> None:
    # The CLI entry (every command's module, the parser with `farmhost demo` registered) and the App of `farmhost
    # run`, started and stopped, in a fresh interpreter: the demo's HA harness stays out of a production install.
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(data_dir)], capture_output=True, text=True, env=clean_env(), timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
