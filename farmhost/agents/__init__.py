"""Agent runs on the host: the queue per group, the sandbox backends, the LLM proxy and the run logs.

Nothing is imported here: `farmhost.agents.launch` (the CLI's `doctor`) must not pull in the LLM proxy's web
server. Import from the submodules (`jobs`, `runtime`, `proxy.server`).
"""
