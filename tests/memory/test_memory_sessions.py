"""The chat part of memory_search on a real database: new messages, the sliding window, re-binding, what it reads.

In-process (MemoryService on a real SQLite file, another connection playing the CLI), so the counters are visible;
tests/memory/test_memory_get.py and test_memory_sessions_daemon.py go through the real daemon.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import wait_for_async

from farmhost.groups.registry import new_group, register, unregister
from farmhost.layout import DataLayout
from farmhost.memory.corpus import CorpusStats
from farmhost.memory.indexer_process import MODULE as BUILDER_MODULE
from farmhost.memory.search import MemoryService, Sources
from farmhost.memory.sessions import NEW_ROWS_ON_LOOP, WindowStats
from farmhost.store import transcripts
from farmhost.store.db import Database

T0 = datetime(2026, 5, 17, 6, 0, tzinfo=UTC)
FIELD, ORCHARD = "telegram:200", "telegram:300"


class Farm:
    """A data dir with the group `field` (chat telegram:200) and the daemon's connection to its database."""

    def __init__(self, root: Path) -> None:
        self.layout = DataLayout(root)
        self.layout.create()
        self.db = Database.open(root)
        self.register("field", FIELD)
        (self.layout.workspace("field") / "MEMORY.md").write_text("# Field\n\nThe pump house is by the river.\n")
        self.sent = 0

    def register(self, folder: str, jid: str) -> None:
        with self.db.tx() as conn:
            group = new_group(
                conn, jid=jid, name=folder.title(), folder=folder, trigger=None, requires_trigger=False,
                is_main=False, at=T0,
            )  # fmt: skip
            register(conn, self.layout, group, reuse=True)  # as the operator: its workspace is written first

    def unregister(self, folder: str) -> None:
        with self.db.tx() as conn:
            unregister(conn, folder)

    def post(self, jid: str, *texts: str, db: Database | None = None) -> list[int]:
        """Append messages to a chat's transcript (on the daemon's connection unless `db` is another)."""
        ids = []
        with (db or self.db).tx() as conn:
            for text in texts:
                self.sent += 1
                at = T0 + timedelta(seconds=self.sent)
                row = transcripts.append(conn, chat_jid=jid, direction="in", sender="ana", text=text, at=at)
                assert row is not None
                ids.append(row)
        return ids


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    made = Farm(tmp_path / "data")
    yield made
    made.db.close()


def search(
    service: MemoryService, farm: Farm, query: str, folder: str = "field", sources: Sources = "all", top_k: int = 64
) -> list[dict[str, Any]]:
    return asyncio.run(service.search(folder, query, top_k=top_k, sources=sources, db=farm.db))


def texts(hits: list[dict[str, Any]]) -> list[str]:
    return [h["snippet"] for h in hits if h["source"] == "session"]


def stats(service: MemoryService, folder: str = "field") -> tuple[CorpusStats, WindowStats]:
    found = service.stats(folder)
    assert found is not None
    return found


def test_messages_posted_after_a_search_are_found_by_the_next(farm: Farm) -> None:
    service = MemoryService(farm.layout)
    farm.post(FIELD, "the north valve leaks")
    assert texts(search(service, farm, "valve")) == ["the north valve leaks"]
    farm.post(FIELD, "valve replaced by rui")
    farm.post(ORCHARD, "orchard valve is fine")  # another chat, bound to no group: never this folder's
    hits = search(service, farm, "valve")
    assert sorted(texts(hits)) == ["the north valve leaks", "valve replaced by rui"]
    session = next(h for h in hits if h["snippet"] == "valve replaced by rui")
    assert session == {
        "source": "session",
        "score": session["score"],
        "groupFolder": "field",
        "chatJid": FIELD,
        "sender": "ana",
        "timestamp": "2026-05-17T06:00:02.000Z",
        "snippet": "valve replaced by rui",
    }
    corpus, window = stats(service)
    assert (corpus.sessions_indexed, window.loads) == (2, 1), "the second message came alone, no second load"


def test_a_warm_search_with_nothing_new_indexes_no_message_and_fetches_no_row(farm: Farm) -> None:
    service = MemoryService(farm.layout)
    farm.post(FIELD, *(f"message {n} about the pump" for n in range(40)))
    search(service, farm, "pump")
    corpus, window = stats(service)
    before = (corpus.sessions_indexed, corpus.segments_indexed, window.rows_fetched, window.loads)
    assert before[0] == 40 and before[2] == 40
    for query in ("pump", "river", "message 7"):
        for sources in ("all", "memory", "sessions"):
            search(service, farm, query, sources=sources)  # type: ignore[arg-type]
    assert (corpus.sessions_indexed, corpus.segments_indexed, window.rows_fetched, window.loads) == before
    farm.post(FIELD, "one more about the pump")
    search(service, farm, "pump")
    assert (corpus.sessions_indexed, window.rows_fetched, window.loads) == (41, 41, 1), "only the new one"


def test_the_window_keeps_the_latest_messages_and_stays_bounded(farm: Farm) -> None:
    service = MemoryService(farm.layout, session_limit=5)
    farm.post(FIELD, *(f"pump note {n}" for n in range(8)))
    assert sorted(texts(search(service, farm, "pump"))) == [f"pump note {n}" for n in range(3, 8)]
    for n in range(8, 20):
        farm.post(FIELD, f"pump note {n}")
        found = sorted(texts(search(service, farm, "pump")), key=lambda t: int(t.split()[-1]))
        assert found == [f"pump note {m}" for m in range(n - 4, n + 1)], "the oldest dropped out"
    corpus, window = stats(service)
    assert (corpus.sessions_indexed, corpus.sessions_evicted) == (5 + 12, 12), "the load read only the latest 5"
    assert corpus.sessions_indexed - corpus.sessions_evicted == 5, "the corpus holds the window, no more"
    assert window.loads == 1


def test_a_memory_hit_scores_the_same_whichever_sources_are_asked_for(farm: Farm) -> None:
    service = MemoryService(farm.layout)
    farm.post(FIELD, "the pump by the river stopped", "river is high today")
    every = search(service, farm, "pump river")
    memory = search(service, farm, "pump river", sources="memory")
    sessions = search(service, farm, "pump river", sources="sessions")
    assert [h["source"] for h in memory] == ["memory"] and {h["source"] for h in sessions} == {"session"}
    assert [h for h in every if h["source"] == "memory"] == memory
    assert [h for h in every if h["source"] == "session"] == sessions
    assert [h["score"] for h in every] == sorted((h["score"] for h in every), reverse=True)
    assert len(search(service, farm, "pump river", top_k=1, sources="sessions")) == 1


def test_removing_the_group_or_binding_its_chat_elsewhere_changes_what_is_searched(farm: Farm) -> None:
    service = MemoryService(farm.layout)
    farm.post(FIELD, "field pump is on")
    farm.post(ORCHARD, "orchard pump is off")
    assert texts(search(service, farm, "pump")) == ["field pump is on"]
    farm.unregister("field")
    assert texts(search(service, farm, "pump")) == [], "an unregistered folder has no chat"
    farm.register("field", ORCHARD)
    assert texts(search(service, farm, "pump")) == ["orchard pump is off"], "the folder's chat now"
    farm.register("hill", FIELD)
    assert texts(search(service, farm, "pump", folder="hill")) == ["field pump is on"], "the chat follows its group"
    farm.post(FIELD, "hill pump is new")
    assert sorted(texts(search(service, farm, "pump", folder="hill"))) == ["field pump is on", "hill pump is new"]
    assert texts(search(service, farm, "pump", folder="field")) == ["orchard pump is off"]
    assert texts(search(service, farm, "pump", folder="global")) == []


def test_rows_another_connection_deletes_leave_the_window(farm: Farm) -> None:
    service = MemoryService(farm.layout)
    first, second = farm.post(FIELD, "pump alpha", "pump beta")
    assert sorted(texts(search(service, farm, "pump"))) == ["pump alpha", "pump beta"]
    other = Database.open(farm.layout.root)  # what a CLI or a hand-run sqlite3 would be
    on_loop: list[str] = []
    farm.db.conn.set_trace_callback(on_loop.append)
    try:
        with other.tx() as conn:
            conn.execute("DELETE FROM transcript WHERE id = ?", (first,))
        assert texts(search(service, farm, "pump")) == ["pump beta"]
        assert stats(service)[1].checks == 1 and not any("count(" in sql for sql in on_loop), "counted in the thread"
        with other.tx() as conn:
            conn.execute("DELETE FROM transcript WHERE id = ?", (second,))
        farm.post(FIELD, "pump gamma")  # SQLite hands out max(id) + 1: an id below the newest one held
        assert texts(search(service, farm, "pump")) == ["pump gamma"]
        farm.post(FIELD, "pump delta", db=other)  # another connection adding rows only: no reload
        loads = stats(service)[1].loads
        assert sorted(texts(search(service, farm, "pump"))) == ["pump delta", "pump gamma"]
        assert stats(service)[1].loads == loads
        search(service, farm, "pump")
        assert stats(service)[1].checks == 3, "counted only after another connection committed"
    finally:
        farm.db.conn.set_trace_callback(None)
        other.close()


def test_a_burst_of_new_rows_is_read_in_the_worker_thread_not_on_the_loop(farm: Farm) -> None:
    service = MemoryService(farm.layout, session_limit=NEW_ROWS_ON_LOOP * 3)
    seen: list[str] = []
    farm.db.conn.set_trace_callback(seen.append)  # every statement on the daemon's (the event loop's) connection
    farm.post(FIELD, *(f"pump {n}" for n in range(NEW_ROWS_ON_LOOP * 2)))
    search(service, farm, "pump")
    farm.post(FIELD, *(f"valve {n}" for n in range(NEW_ROWS_ON_LOOP + 1)))
    assert len(texts(search(service, farm, "valve"))) == 64
    corpus, window = stats(service)
    assert window.loads == 1, "the burst was caught up, not loaded anew"
    assert corpus.sessions_indexed == NEW_ROWS_ON_LOOP * 3 + 1 and corpus.sessions_evicted == 1
    farm.post(FIELD, *(f"tank {n}" for n in range(NEW_ROWS_ON_LOOP * 3 + 1)))  # more than the window
    assert len(texts(search(service, farm, "tank"))) == 64
    assert window.loads == 2, "more new rows than the window holds: its latest are loaded"
    assert corpus.sessions_indexed - corpus.sessions_evicted == NEW_ROWS_ON_LOOP * 3
    farm.db.conn.set_trace_callback(None)
    assert not any("DESC" in sql for sql in seen), "the window is never read on the loop's connection"
    polls = [sql for sql in seen if "FROM transcript" in sql and "id >" in sql]
    assert polls and all(f"LIMIT {NEW_ROWS_ON_LOOP + 1}" in sql for sql in polls), "a batch (+1) at most on the loop"


def _builder_running() -> bool:
    """Whether a memory builder process of this test process runs (a search's thread started it)."""
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            running = ppid == me and BUILDER_MODULE.encode() in (proc / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if running:
            return True
    return False


async def test_a_search_given_up_keeps_the_corpus_until_its_thread_is_done(farm: Farm) -> None:
    """A timed-out request cannot stop its thread: the next search must wait for it, not run beside it."""
    notes = farm.layout.workspace("field") / "memory"
    notes.mkdir()
    for n in range(150):
        (notes / f"note-{n}.md").write_text(
            "".join(f"## Pump {n}.{k}\n\nThe pump ran {k} minutes.\n\n" for k in range(20))
        )
    service = MemoryService(farm.layout)
    first = asyncio.ensure_future(service.search("field", "pump", top_k=8, db=farm.db))
    await wait_for_async(_builder_running, timeout=20, what="the first search's build in its builder process")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    hits = await service.search("field", "pump minutes", top_k=8, db=farm.db)
    assert hits and all(h["source"] == "memory" for h in hits)
    corpus, _ = stats(service)
    assert (corpus.snapshots_built, corpus.files_from_snapshot, corpus.files_chunked) == (1, 151, 0), (
        "one build (by the builder process) of the 151 files: the two searches never ran at once"
    )
