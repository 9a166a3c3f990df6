"""pytest's rewritten test modules written once, in parallel, before the xdist workers start (a fresh clone's cost).

pytest rewrites the asserts of every test module, conftest and plugin it imports and caches the result as
`__pycache__/<name>.<tag>-pytest-<version>.pyc`. In a fresh clone no cache exists yet, and the four workers,
collecting the same modules at the same moment, each rewrite all of them: ~4.6 CPU-seconds per worker here, three
of them wasted. The controller writes them first, split over the machine's cores; the workers then find them.
pytest's rewrite functions are private: with a pytest that has other ones, or `--assert=plain`, nothing is
written here and the workers rewrite as before.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Final

import pytest

# Fewer modules to rewrite than this (an edit or two since the last run): the workers do it as cheaply.
MIN_MODULES: Final = 20

_config: pytest.Config | None = None  # the controller's, inherited by the forked processes


def selected(args: Iterable[str], tests: Path, plugins: Iterable[str], *, cwd: Path) -> list[Path]:
    """The modules a run of pytest's `args` (relative to `cwd`) rewrites.

    The test modules under the arguments, every conftest, and `plugins` (module names in `tests`).
    """
    targets = [(cwd / arg.split("::", 1)[0]).resolve() for arg in args]
    modules = [fn for fn in tests.rglob("test_*.py") if any(t == fn or t in fn.parents for t in targets)]
    return sorted({*modules, *tests.rglob("conftest.py"), *(tests / f"{name}.py" for name in plugins)})


def prewrite(config: pytest.Config, files: Iterable[Path], *, processes: int | None = None) -> int:
    """Write the rewritten bytecode of each of `files` that has none (or a stale one); returns how many were written.

    `processes`: how many write them (default: the machine's cores, at most 4; 1 writes them in this process).
    """
    try:
        from _pytest.assertion import rewrite

        config.stash[rewrite.assertstate_key]  # a KeyError with --assert=plain: nothing is rewritten
        todo = [fn for fn in files if rewrite._read_pyc(fn, _pyc(fn)) is None]
    except (ImportError, AttributeError, KeyError):
        return 0
    if len(todo) < MIN_MODULES:
        return 0
    global _config
    _config = config
    processes = processes or min(os.cpu_count() or 1, 4)
    if processes == 1:
        return sum(map(_rewrite, todo))
    # Forked: the children have pytest, the plugins and the config already. The controller calls this from
    # pytest_configure, before xdist starts its workers or any thread (a fork of a threaded process may deadlock).
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        return sum(pool.map(_rewrite, todo, chunksize=max(1, len(todo) // (4 * processes))))


def _pyc(fn: Path) -> Path:
    from _pytest.assertion import rewrite

    return rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)


def _rewrite(fn: Path) -> int:
    from _pytest.assertion import rewrite

    assert _config is not None
    pyc = _pyc(fn)
    if not rewrite.try_makedirs(pyc.parent):
        return 0
    try:
        source_hash, code = rewrite._rewrite_test(fn, _config)
    except (OSError, SyntaxError, ValueError):
        return 0  # pytest meets it again as it imports the module, and reports it there
    return int(rewrite._write_pyc(_config.stash[rewrite.assertstate_key], code, source_hash, pyc))
