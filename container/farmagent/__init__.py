"""farmagent: the agent side of farmhost (IPC client, MCP server, LLM runner), run inside the sandbox."""

__version__ = "0.1.0"
