"""Fixtures of the agent tests: the real local model server, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from local_llm import LocalLlm


@pytest.fixture(scope="session")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLlm]:
    """llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct on 127.0.0.1 (tests/local_llm.py)."""
    with LocalLlm.start(tmp_path_factory.mktemp("local-llm")) as server:
        yield server
    assert server.proc.returncode == 0, server.log_tail()
