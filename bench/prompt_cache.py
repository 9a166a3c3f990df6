"""Prompt cache benchmark: what the built-in runner's prompt costs a llama.cpp server, run after run.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/prompt_cache.py                                  # this checkout's runner
    .venv/bin/python bench/prompt_cache.py --before /path/to/old/container  # and an older runner, for a before/after

The real runner (`python -m farmagent.run`) answers a farm question of the main group against a real daemon on a
fresh data directory (its global MEMORY.md as `farmhost init` writes it, a short MEMORY.md for main), and talks to
llama.cpp's server (xllamacpp with SmolLM2-135M-Instruct from the dev dependencies, the server of the test suite,
with an 8,192-token context here so the old ~5,500-token prompt fits) through a small relay
(farmhost_dev/llm_relay.py) that records each request's body size and the server's own figures:
`usage.prompt_tokens`, and `timings.prompt_n` (tokens read anew) against `timings.cache_n` (tokens reused from
the slot's cache). The relay also caps `max_tokens` at 16: the answer's length does not change the prompt, only
the bench's time.

Three runs, one request each (maxTurns 1): main at 06:30, main again "a minute later" (the AgentInput's `now`
is the host's clock, so a minute later is a field, not a wait), then the field group. The third run's cache is
the second's, as it is on a server with one slot. Then a conversation (`contextMode: group`, as a chat's runs
are): main asks, answering in up to HISTORY_ANSWER_TOKENS tokens (an answer of a real model's length), and asks
again a minute later with that exchange as its history: what the second run reads anew is the figure.

The script reports; it never gates: the exit status is 0 whatever the figures (2 when it could not run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # farmhost_dev: the dev tools at the repo root

from farmhost_dev.llm_relay import Exchange, Relay
from farmhost_dev.local_llm import LocalLlm
from farmhost_dev.testing import FIELD_JID, MAIN_JID, clean_env, init_data_dir_in_process, running_daemon

CONTEXT_TOKENS: Final = 8192
# SmolLM2's own template ignores `tools`; models that call tools (Qwen2.5, Hermes) put them in the system turn.
TEMPLATE: Final = Path(__file__).resolve().parent / "chatml_tools.jinja"
MAX_TOKENS: Final = 16
HISTORY_ANSWER_TOKENS: Final = 200
# A question a small model answers at length, so the history is of a real answer's size.
DETAILED: Final = "Explain step by step how to check the irrigation pump and its filter before the season."
FOLLOW_UP: Final = "And how often should the filter be cleaned?"
TOKENS_PER_SECOND: Final = 10.0  # a Pi 5 reading a prompt with a 1-3 B model is in this range (docs/performance.md)
QUESTION: Final = "Is the irrigation pump on, and how dry is field 3?"
MAIN_MEMORY: Final = (
    "# Farm notes\n\nThe north field grows San Marzano tomatoes. Irrigation runs at 06:00 from the well pump.\n"
)
HIT: Final = [
    {"citation": "memory/fields.md#L3-L4", "groupFolder": "main", "snippet": "Field 3 is sandy; water it first."}
]


def agent_input(folder: str, now: str, **fields: Any) -> dict[str, Any]:
    main = folder == "main"
    document = {
        "version": 1,
        "runId": f"bench-{folder}-{now[11:16].replace(':', '')}",
        "groupFolder": folder,
        "isMain": main,
        "prompt": QUESTION,
        "scheduled": False,
        "taskId": None,
        "contextMode": "isolated",
        "timezone": "Europe/Amsterdam",
        "now": now,
        "chatJid": MAIN_JID if main else FIELD_JID,
        "memory": HIT if main else [],
        "maxTurns": 1,
        "model": "smollm2",
    }
    document.update(fields)
    return document


def run_agent(data_dir: Path, folder: str, document: dict[str, Any], base_url: str, source: Path | None) -> None:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("FARMAGENT_", "OPENAI_"))}
    env.update(
        FARMAGENT_IPC_DIR=str(data_dir / "ipc" / folder),
        FARMAGENT_GROUP_DIR=str(data_dir / "groups" / folder),
        FARMAGENT_GLOBAL_DIR=str(data_dir / "groups" / "global"),
        FARMAGENT_FARM_STATE_DIR=str(data_dir / "farm-state"),
        FARMAGENT_LLM_BASE_URL=base_url,
        FARMAGENT_LLM_TIMEOUT="600",
        PYTHONDONTWRITEBYTECODE="1",
    )
    if source is not None:
        env["PYTHONPATH"] = str(source)
    done = subprocess.run(
        [sys.executable, "-m", "farmagent.run"],
        input=json.dumps(document).encode(),
        capture_output=True,
        env=env,
        timeout=900,
        check=False,
    )
    if not done.stdout.strip() or os.environ.get("BENCH_VERBOSE"):
        print(done.stderr.decode()[-3000:], file=sys.stderr)
    if not done.stdout.strip():
        raise RuntimeError("the runner wrote no result (its log is above)")


def measure(relay: Relay, data_dir: Path, source: Path | None) -> list[Exchange]:
    start = len(relay.exchanges)
    for folder, now in (
        ("main", "2026-07-01T04:30:00Z"),
        ("main", "2026-07-01T04:31:00Z"),
        ("field", "2026-07-01T04:32:00Z"),
    ):
        run_agent(data_dir, folder, agent_input(folder, now), relay.base_url, source)
    stored = data_dir / "groups" / "main" / ".farmagent" / "conversation.json"
    stored.unlink(missing_ok=True)  # each runner measured starts its conversation afresh
    relay.max_tokens = HISTORY_ANSWER_TOKENS
    try:
        asked = agent_input("main", "2026-07-01T04:33:00Z", contextMode="group", prompt=DETAILED)
        run_agent(data_dir, "main", asked, relay.base_url, source)
    finally:
        relay.max_tokens = MAX_TOKENS
    follow_up = agent_input("main", "2026-07-01T04:34:00Z", contextMode="group", prompt=FOLLOW_UP)
    run_agent(data_dir, "main", follow_up, relay.base_url, source)
    return relay.exchanges[start:]


def minutes(tokens: int) -> float:
    """How long reading `tokens` takes at TOKENS_PER_SECOND."""
    return tokens / TOKENS_PER_SECOND / 60


def report(name: str, runs: list[Exchange]) -> dict[str, Any]:
    first, again, other, asked, follow_up = runs
    row = {
        "runner": name,
        "first_prompt_tokens": first.prompt_tokens,
        "first_body_bytes": first.body_bytes,
        "same_group_new_tokens": again.prompt_n,
        "same_group_cached_tokens": again.cache_n,
        "other_group_new_tokens": other.prompt_n,
        "other_group_cached_tokens": other.cache_n,
        "other_group_body_bytes": other.body_bytes,
        "history_answer_tokens": asked.completion_tokens,
        "with_history_new_tokens": follow_up.prompt_n,
        "with_history_cached_tokens": follow_up.cache_n,
        "with_history_prompt_tokens": follow_up.prompt_tokens,
    }
    print(
        f"{name}: first request {first.prompt_tokens} prompt tokens ({first.body_bytes} bytes, "
        f"{minutes(first.prompt_tokens):.1f} min at {TOKENS_PER_SECOND:g} tokens/s); "
        f"same group a minute later {again.prompt_n} new / {again.cache_n} cached ({minutes(again.prompt_n):.1f} min); "
        f"another group {other.prompt_n} new / {other.cache_n} cached ({minutes(other.prompt_n):.1f} min); "
        f"same group with the last exchange as history ({asked.completion_tokens}-token answer) "
        f"{follow_up.prompt_n} new / {follow_up.cache_n} cached ({minutes(follow_up.prompt_n):.1f} min)"
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="an older runner's `container` directory to measure first")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prompt-cache-") as tmp:
        root = Path(tmp)
        data_dir = init_data_dir_in_process(root / "data")
        (data_dir / "groups" / "main" / "MEMORY.md").write_text(MAIN_MEMORY)
        try:
            llm = LocalLlm.start(root, context_tokens=CONTEXT_TOKENS, chat_template=TEMPLATE)
        except RuntimeError as err:
            print(f"cannot start the llama.cpp server: {err}", file=sys.stderr)
            return 2
        rows = []
        try:
            with Relay(llm.address, max_tokens=MAX_TOKENS) as relay, running_daemon(data_dir, env=clean_env()):
                if args.before is not None:
                    rows.append(report(f"before ({args.before})", measure(relay, data_dir, args.before)))
                rows.append(report("this checkout", measure(relay, data_dir, None)))
        finally:
            llm.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("LLAMA_LOG_COLORS", "0")
    sys.exit(main())
