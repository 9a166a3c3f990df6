"""Shared fixtures: a data directory with a main and a non-main group, and a running daemon on it."""

from __future__ import annotations

import compileall
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rewrite_cache
from farmhost_testing import TIMEOUT_SCALE_ENV, Daemon, copy_data_dir, init_data_dir, timeout_scale

# pytest keeps each test module's assertion rewrite as bytecode, unless the interpreter writes none: a shell with
# PYTHONDONTWRITEBYTECODE (this kind of machine sets it) made every run rewrite all 315 test modules again in each
# worker and the controller, 8 CPU-seconds each, most of a worker's start. Only pytest's processes are told
# otherwise here; what they start keeps its environment.
sys.dont_write_bytecode = False
# Unlike the above, an environment variable, so the Wyoming server the tests start has it too: the Whisper model's
# CTranslate2 threads sleep while they wait, as farmhost's own speech-to-text worker's do (WORKER_ENV_DEFAULTS),
# instead of spinning on a busy machine. test_embedded.py removes it where it checks the worker's own default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# real Home Assistant (`ha`, `ha_env`, `ha_reset`); scripted LLM `llm_stub`; fake Bot API `fake_telegram`; a Whisper
# model, spoken notes and a Wyoming server (`whisper_base`, `irrigation_note`, `wyoming_server`); the local model
# server `local_llm`; the files sharing a session fixture kept on one worker
pytest_plugins = [
    "ha_fixture",
    "llm_stub",
    "telegram_stub",
    "mosquitto",
    "voice_fixture",
    "local_llm_fixture",
    "shared_workers",
]


def pytest_configure(config: pytest.Config) -> None:
    """Compile farmhost's sources and pytest's rewritten test modules once, before the workers start.

    A shell with PYTHONDONTWRITEBYTECODE (this kind of machine sets it) reads bytecode but never writes it, so each
    `farmhost run`, CLI call, sandboxed agent and helper script of the suite would compile every module it imports
    again: a quarter of a daemon's start. Python checks each file's mtime against its source, so an edited module is
    never run stale.
    """
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller did it
    import farmagent

    import farmhost
    import farmhost_dev

    packages = (farmhost, farmhost_dev, farmagent)  # the daemon and CLI, the tests' helpers, the sandboxed agent
    tests = Path(__file__).parent
    roots = [Path(str(package.__file__)).parent for package in packages] + [tests]
    for root in roots:
        if os.access(root, os.W_OK):  # a read-only install brings its own bytecode
            compileall.compile_dir(root, quiet=1, workers=0)
    # pytest's own rewritten test modules, conftests and plugins, which it caches apart (rewrite_cache.py): only
    # when several workers will each import every test module
    if getattr(config.option, "numprocesses", None):
        modules = rewrite_cache.selected(config.args, tests, pytest_plugins, cwd=config.invocation_params.dir)
        rewrite_cache.prewrite(config, modules)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep what collection made (the test modules and what they import, the items) out of the cyclic GC's way.

    A worker holds some 220,000 objects after collection; each full collection walked them all again (0.2-0.3 s,
    ten times and more per worker: a fifth of the tests' in-process CPU). Frozen, only what the tests make is
    walked. Garbage first, so none of it is kept for good.
    """
    gc.collect()
    gc.freeze()


def pytest_report_header(config: pytest.Config) -> str:
    """Say how far the deadlines are stretched now (see farmhost_testing.timeout_scale); each test's own follows."""
    return f"farmhost deadlines: x{timeout_scale():.2f} now ({TIMEOUT_SCALE_ENV} or the load average, read per test)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Test files holding a `slow` test run first, the rest after them, each file's tests in their own order.

    Workers take whole files (`--dist loadfile`) in this order: the long end-to-end files start at once and the
    short ones fill the gaps, instead of a long file starting last and running alone while the other worker idles.
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable


_BASE_TIMEOUT = pytest.StashKey[tuple[float, tuple[Any, ...], dict[str, Any]]]()


def _base_timeout(item: pytest.Item) -> tuple[float, tuple[Any, ...], dict[str, Any]]:
    """The pytest-timeout a test has before stretching: its marker's, else `--timeout`, PYTEST_TIMEOUT or the ini's.

    With the marker's other arguments (method, func_only), kept when the stretched marker replaces it.
    """
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        base = marker.args[0] if marker.args else marker.kwargs["timeout"]
        kwargs = {k: v for k, v in marker.kwargs.items() if k != "timeout"}
        return float(base or 0), tuple(marker.args[1:]), kwargs
    value = item.config.getoption("timeout", None)
    if value is None:
        value = os.environ.get("PYTEST_TIMEOUT") or item.config.getini("timeout") or 0
    return float(value), (), {}


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stretch the test's pytest-timeout like its deadlines, by the scale measured as the test starts.

    pytest-timeout reads the marker in its own `pytest_runtest_protocol` wrapper, before the test's setup, and times
    setup, call and teardown together; this wrapper runs first (tryfirst), so the timer it starts is the stretched
    one. Measured per test, not once at collection: a long session's later tests follow the load when they run,
    like the helpers' deadlines (`scaled`), which are computed when they are called.
    """
    if _BASE_TIMEOUT not in item.stash:  # before any stretched marker of ours (a rerun keeps its base)
        item.stash[_BASE_TIMEOUT] = _base_timeout(item)
    base, args, kwargs = item.stash[_BASE_TIMEOUT]
    scale = timeout_scale()
    if base > 0 and scale > 1:
        item.add_marker(pytest.mark.timeout(base * scale, *args, **kwargs), append=False)
    yield


@pytest.fixture(scope="session")
def data_dir_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `data_dir` layout, made once per session by the real CLI (`farmhost init`, `farmhost group add` x2)."""
    return init_data_dir(tmp_path_factory.mktemp("data-template") / "data")


@pytest.fixture
def data_dir(tmp_path: Path, data_dir_template: Path) -> Path:
    """An initialised data dir with groups `main` (main, telegram:100) and `field` (telegram:200).

    A fresh copy of the session's `data_dir_template` (what the CLI made), not three CLI runs per test.
    """
    return copy_data_dir(data_dir_template, tmp_path / "data")


@pytest.fixture
def daemon(data_dir: Path) -> Iterator[Daemon]:
    """A running `farmhost run` on `data_dir`; stopped (SIGTERM) at the end."""
    proc = Daemon(data_dir).start()
    yield proc
    if proc.proc is not None:
        assert proc.stop() == 0, proc.log()


_FILE_SECONDS: dict[str, float] = {}
_SLOWEST_FILES = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's time (setup, call, teardown) to its test file's total (on the xdist controller too)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest test files and the sum over all files: what to look at first to make the suite faster."""
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest {_SLOWEST_FILES} test files (setup + call + teardown)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:_SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {seconds / total:5.1%}  {path}")
    terminalreporter.write_line(f"{total:8.1f} s  in {len(_FILE_SECONDS)} files (summed over the workers)")
