"""The scripted LLM for the tests: the `llm_stub` fixture, and `farmhost_dev.llm_stub` by the name tests import.

The server itself lives in `farmhost_dev.llm_stub` (shared with bench/, no pytest in it); see its docstring.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from farmhost_dev.llm_stub import (
    Fail,
    Raw,
    Recorded,
    Reply,
    ScriptedLLM,
    Step,
    Streamed,
    ToolCall,
    ToolCalls,
    pump_state_reply,
)

__all__ = [
    "Fail",
    "Raw",
    "Recorded",
    "Reply",
    "ScriptedLLM",
    "Step",
    "Streamed",
    "ToolCall",
    "ToolCalls",
    "llm_stub",
    "pump_state_reply",
]


@pytest.fixture
def llm_stub() -> Iterator[ScriptedLLM]:
    """A running ScriptedLLM on 127.0.0.1 with an empty script (`llm_stub.script(...)` adds steps)."""
    with ScriptedLLM() as stub:
        yield stub
