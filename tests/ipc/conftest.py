"""Fixtures of the IPC engine tests: one real daemon shared by a module's tests (they use unique ids)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from farmhost_testing import Daemon
from ipc_support import Env, make_data_dir


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A data dir with `main` and `field` and a running daemon, shared by one test module."""
    data_dir = make_data_dir(tmp_path_factory.mktemp("ipc") / "data")
    for folder in ("main", "field"):
        (data_dir / "groups" / folder / "note.txt").write_text(f"a note of {folder}\n")
    daemon = Daemon(data_dir).start()
    yield Env(data_dir=data_dir, daemon=daemon)
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()
