"""The real local model server for the tests that need one: `local_llm`, llama.cpp with SmolLM2, once per session.

Its test files run on one worker (shared_workers.py), so the suite starts it once and its prompt cache serves
them all: reading the runner's ~1,500-token prompt is most of what the server costs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from farmhost_dev.local_llm import LocalLlm


@pytest.fixture(scope="session")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLlm]:
    """llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct on 127.0.0.1 (farmhost_dev/local_llm.py)."""
    with LocalLlm.start(tmp_path_factory.mktemp("local-llm")) as server:
        yield server
    assert server.proc.returncode == 0, server.log_tail()
