"""Shared fixtures: a data directory with a main and a non-main group, and a running daemon on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import TIMEOUT_SCALE_ENV, Daemon, copy_data_dir, init_data_dir, timeout_scale

# real Home Assistant (`ha`, `ha_env`, `ha_reset`); scripted LLM `llm_stub`; fake Bot API `fake_telegram`
pytest_plugins = ["ha_fixture", "llm_stub", "telegram_stub", "mosquitto"]


def pytest_report_header(config: pytest.Config) -> str:
    """Say how far the deadlines are stretched on this run (see farmhost_testing.timeout_scale)."""
    return f"farmhost deadlines: x{timeout_scale():.2f} ({TIMEOUT_SCALE_ENV} or the load average)"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch every test's pytest-timeout (the ini's, `--timeout`'s or its own marker's) like the tests' deadlines."""
    scale = timeout_scale()
    default = config.getoption("timeout", None) or config.getini("timeout")
    if scale <= 1 or not default:
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = float(marker.args[0]) if marker is not None and marker.args else float(default)
        if base > 0:
            item.add_marker(pytest.mark.timeout(base * scale), append=False)


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
