"""Product code and benchmarks never reach into tests/: what they need of the tests' tooling is in farmhost_dev/.

Read from the sources (the imports and sys.path edits the interpreter would run), so a new `from llm_stub import`
in bench/ or a `sys.path.insert(..., "tests")` in farmhost/ fails here, not on a machine without the checkout.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
