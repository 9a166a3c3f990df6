"""Agent runs on the host: the queue per group, the sandbox backends, the LLM proxy and the run logs."""

from __future__ import annotations

from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.proxy.server import LlmProxy
from farmhost.agents.runtime import AgentRuntime

__all__ = ["AgentJob", "AgentOutcome", "AgentRuntime", "LlmProxy"]
