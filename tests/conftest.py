"""Shared fixtures: a data directory with a main and a non-main group, and a running daemon on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import Daemon, init_data_dir

# real Home Assistant (`ha`, `ha_env`, `ha_reset`); scripted LLM `llm_stub`; fake Bot API `fake_telegram`
pytest_plugins = ["ha_fixture", "llm_stub", "telegram_stub"]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """An initialised data dir with groups `main` (main, telegram:100) and `field` (telegram:200)."""
    return init_data_dir(tmp_path / "data")


@pytest.fixture
def daemon(data_dir: Path) -> Iterator[Daemon]:
    """A running `farmhost run` on `data_dir`; stopped (SIGTERM) at the end."""
    proc = Daemon(data_dir).start()
    yield proc
    if proc.proc is not None:
        assert proc.stop() == 0, proc.log()
