"""The LLM proxy: the only way out of a sandbox, one Unix socket per run, budgets and redaction on the way.

`server` owns the listener's lifetime; `exchange` one request and its answer; `upstream`, `chain` the model
endpoints; `budget`, `tokens` the accounting; `parse`, `body`, `stream` the wire; `images` the run's photo, only
for the endpoints that can see; `errors` the refusals.
"""
