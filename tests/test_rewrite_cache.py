"""The controller writes pytest's rewritten test modules before the workers start; pytest then finds them."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.assertion import rewrite
from rewrite_cache import MIN_MODULES, _pyc, prewrite, selected


def _modules(root: Path, count: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = [root / f"test_m{i}.py" for i in range(count)]
    for i, fn in enumerate(files):
        fn.write_text(f"def test_x():\n    value = {i}\n    assert value == {i}\n")
    return files


def test_each_module_gets_the_rewritten_bytecode_pytest_reads_and_a_second_pass_writes_none(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    files = _modules(tmp_path / "tests", MIN_MODULES)
    assert prewrite(pytestconfig, files, processes=1) == MIN_MODULES
    for fn in files:
        code = rewrite._read_pyc(fn, _pyc(fn))
        assert code is not None
        # rewritten: the test's assert keeps its operands for pytest's failure message
        (test,) = [c for c in code.co_consts if hasattr(c, "co_varnames")]
        assert any(name.startswith("@py_assert") for name in test.co_varnames)
    assert prewrite(pytestconfig, files, processes=1) == 0  # all cached already
    files[0].write_text("def test_x():\n    assert 2 == 2\n")  # an edit: a stale pyc, but too few to bother
    assert prewrite(pytestconfig, files, processes=1) == 0


def test_a_module_that_does_not_parse_is_left_to_pytest_and_the_others_are_written(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    files = _modules(tmp_path / "tests", MIN_MODULES)
    files[3].write_text("def test_x(:\n")
    assert prewrite(pytestconfig, files, processes=1) == MIN_MODULES - 1
    assert not _pyc(files[3]).exists()


def test_only_the_modules_under_the_runs_arguments_are_selected(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    ipc, cli = _modules(tests / "ipc", 2), _modules(tests / "cli", 2)
    for path in (tests / "conftest.py", tests / "ipc" / "conftest.py", tests / "ha_fixture.py", tests / "ipc" / "x.py"):
        path.write_text("")
    plugins = ["ha_fixture"]
    whole = selected(["tests"], tests, plugins, cwd=tmp_path)
    assert set(whole) == {*ipc, *cli, tests / "conftest.py", tests / "ipc" / "conftest.py", tests / "ha_fixture.py"}
    narrow = selected([f"tests/ipc/{ipc[0].name}::test_x", "tests/nowhere"], tests, plugins, cwd=tmp_path)
    assert set(narrow) == {ipc[0], tests / "conftest.py", tests / "ipc" / "conftest.py", tests / "ha_fixture.py"}
