"""Fixtures of the farmagent tests: one real daemon per test module (tests use fresh request ids)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_support import MEMORY_TEXT, Farm
from farmhost_testing import Daemon, init_data_dir_in_process


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    """A data dir with `main` (a MEMORY.md about tomatoes) and `field`, served by a real daemon."""
    data_dir = init_data_dir_in_process(tmp_path_factory.mktemp("farm") / "data")
    (data_dir / "groups" / "main" / "MEMORY.md").write_text(MEMORY_TEXT)
    daemon = Daemon(data_dir).start()
    yield Farm(data_dir=data_dir, daemon=daemon)
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()
