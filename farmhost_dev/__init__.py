"""Development tools shared by the tests and the benchmarks (never shipped: not in farmhost's wheel).

- `farmhost_dev.testing`: drive the real `farmhost` CLI and daemon as subprocesses, drop request files, wait for
  conditions with deadlines that stretch on a busy machine.
- `farmhost_dev.llm_stub`: a scripted OpenAI-compatible chat-completions server (the stand-in for a hosted LLM).

Nothing here imports pytest; the tests' fixtures stay in tests/ (tests/llm_stub.py registers `llm_stub`).
"""
