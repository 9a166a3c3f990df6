"""Memory search with chat transcripts: the `memory_search` handler over a group with a 5,000-message chat.

Run from the repository root with the project's interpreter::

    .venv/bin/python bench/memory_sessions.py            # 100 and 10,000 memory chunks, under a minute
    .venv/bin/python bench/memory_sessions.py --quick    # 100 chunks only

A real data dir in a temporary directory: the `field` group bound to `telegram:200`, its memory generated as in
`bench/memory_search.py`, and the chat's transcript filled with `--messages` generated messages. It calls the
daemon's own `memory_search` handler (the one the IPC router runs) with a real `RequestContext`, on an event loop:

- ``cold``: the first search (builds the memory index and loads the chat's window);
- ``warm all``/``warm memory``: repeated random queries with nothing new;
- ``new message``: one message appended to the transcript before each search (`sources` "all").

Besides the wall time, ``loop ms`` is the CPU time of the event loop's thread during the search (what the
search keeps every other group waiting for; work in the worker thread is not counted). Reports only, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memory_search import QUERIES, SEED, _sentence, make_workspace, percentile  # bench/ is sys.path[0]

from farmhost.handling import RequestContext
from farmhost.layout import DataLayout
from farmhost.memory.search import MemoryService, memory_handlers
from farmhost.protocol.requests import MemoryActionRequest
from farmhost.store import transcripts
from farmhost.store.db import Database, now_utc
from farmhost.store.groups import Group, get_group, insert_group

JID = "telegram:200"
WARM = 200
NEW = 50


def _setup(root: Path, chunks: int, messages: int) -> tuple[Database, RequestContext]:
    layout = DataLayout(root)
    layout.create_group("field")
    make_workspace_into(layout.workspace("field"), chunks)
    db = Database.open(root)
    rng = random.Random(SEED)
    with db.tx() as conn:
        insert_group(
            conn,
            Group(
                jid=JID,
                name="Field",
                folder="field",
                trigger=None,
                requires_trigger=False,
                is_main=False,
                added_at=now_utc(),
            ),
        )
        for _ in range(messages):
            transcripts.append(conn, chat_jid=JID, direction="in", sender="ana", text=_sentence(rng), at=now_utc())
    group = get_group(db.conn, "field")
    assert group is not None
    ctx = RequestContext(group=group, layout=layout, db=db, now=now_utc(), request_id="bench")
    return db, ctx


def make_workspace_into(workspace: Path, chunks: int) -> None:
    """The generated memory, moved into the group's (existing, empty) workspace."""
    with tempfile.TemporaryDirectory(prefix="memory-sessions-ws-") as tmp:
        ws = make_workspace(Path(tmp) / "w", chunks, SEED + chunks)
        for path in sorted(ws.root.rglob("*.md")):
            target = workspace / path.relative_to(ws.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")


async def _search(ctx: RequestContext, run: Any, query: str, sources: str) -> tuple[float, float, int]:
    """(wall seconds, event-loop thread CPU seconds, hits) of one memory_search."""
    request = MemoryActionRequest.model_validate(
        {
            "type": "memory_action",
            "action": "memory_search",
            "requestId": "bench",
            "params": {"query": query, "topK": 8, "sources": sources},
        }
    )
    wall, cpu = time.perf_counter(), time.thread_time()
    outcome = await run(ctx, request)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert outcome.ok, outcome
    return wall, cpu, len(outcome.result["hits"])


def _line(name: str, samples: Sequence[tuple[float, float, int]], chunks: int) -> str:
    wall = [s[0] * 1000 for s in samples]
    cpu = [s[1] * 1000 for s in samples]
    return (
        f"| {name:<22} | {chunks:>7,} | {len(samples):>4} | {percentile(wall, 50):>8.2f} | {percentile(wall, 99):>8.2f}"
        f" | {percentile(cpu, 50):>8.2f} | {max(cpu):>8.2f} |"
    )


async def bench(chunks: int, messages: int) -> list[str]:
    """The rows for one memory size."""
    rng = random.Random(SEED + chunks)
    with tempfile.TemporaryDirectory(prefix="memory-sessions-") as tmp:
        db, ctx = _setup(Path(tmp) / "data", chunks, messages)
        try:
            run = memory_handlers(MemoryService(ctx.layout))["memory_action:memory_search"].run
            cold = [await _search(ctx, run, "irrigation north field", "all")]
            warm_all = [await _search(ctx, run, rng.choice(QUERIES), "all") for _ in range(WARM)]
            warm_memory = [await _search(ctx, run, rng.choice(QUERIES), "memory") for _ in range(WARM)]
            await _search(ctx, run, "pump", "all")  # back to the window after memory-only searches
            new: list[tuple[float, float, int]] = []
            for _ in range(NEW):
                with db.tx() as conn:
                    text = _sentence(rng)
                    transcripts.append(conn, chat_jid=JID, direction="in", sender="rui", text=text, at=now_utc())
                new.append(await _search(ctx, run, rng.choice(QUERIES), "all"))
        finally:
            db.close()
    return [
        _line("cold (all)", cold, chunks),
        _line("warm all", warm_all, chunks),
        _line("warm memory", warm_memory, chunks),
        _line("new message, all", new, chunks),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print a markdown table; exit status 0 whatever the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="100 memory chunks only")
    parser.add_argument("--messages", type=int, default=transcripts.RECENT_LIMIT, help="messages in the chat")
    args = parser.parse_args(argv)
    sizes = [100] if args.quick else [100, 10_000]
    print(
        f"memory_search with sessions: {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"Python {platform.python_version()}, {args.messages:,} messages in the chat"
    )
    print(
        f"\n| {'measure':<22} | {'chunks':>7} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'loop p50':>8} | {'loop max':>8} |"
    )
    print(f"|{'-' * 24}|{'-' * 8}:|{'-' * 5}:|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|{'-' * 9}:|")
    for size in sizes:
        for row in asyncio.run(bench(size, args.messages)):
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
