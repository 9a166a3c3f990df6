"""memory_search: BM25 over a group's markdown memory, the global memory and its chat, one cached corpus per group."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from farmhost.handling import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.layout import GLOBAL_MEMORY_FOLDER, DataLayout
from farmhost.memory.access import target_folder
from farmhost.memory.corpus import CorpusStats, MemoryCorpus, MemoryHit, SessionHit
from farmhost.memory.get import memory_get
from farmhost.memory.indexer_process import BUILD_TIMEOUT_SECONDS, BuildStop
from farmhost.memory.sessions import SessionUpdate, SessionWindow, WindowStats
from farmhost.memory.snapshot import SUFFIX
from farmhost.protocol.envelope import Outcome, utc_stamp
from farmhost.protocol.params import MemorySearchParams, parse_params
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest
from farmhost.store import transcripts
from farmhost.store.db import Database, parse_iso

# One long file must not crowd out the rest of the memory.
PER_FILE_CAP: Final = 3

# Up to this many indexed documents a warm search ranks on the loop (no thread hop): ~1 ms here, a few on a Pi.
INLINE_SEARCH_DOCUMENTS: Final = 20_000

Sources = Literal["memory", "sessions", "all"]


@dataclass(slots=True)
class _Folder:
    corpus: MemoryCorpus
    window: SessionWindow
    lock: asyncio.Lock


class MemoryService:
    """Keeps one MemoryCorpus per searched folder, with the window of its chats; each search updates only what changed.

    A folder is searched by its own group, by main (any registered group) or for an agent run's prompt, so
    there is at most one corpus per registered group plus one for `global`; each holds one inotify
    instance (`watch.py`) until `close()`.
    """

    def __init__(
        self,
        layout: DataLayout,
        *,
        session_limit: int = transcripts.RECENT_LIMIT,
        build_timeout: float = BUILD_TIMEOUT_SECONDS,
    ) -> None:
        """Nothing is read until a folder's first search.

        Args:
            layout: The data directory; each folder's index is persisted in its `memory-index/`.
            session_limit: How many of the latest messages of a folder's chats are searched.
            build_timeout: Seconds a builder process may take before the daemon builds the index itself.
        """
        self._layout = layout
        self._session_limit = session_limit
        self._build_timeout = build_timeout
        self._folders: dict[str, _Folder] = {}
        self._build_stop = BuildStop()

    async def close(self) -> None:
        """Release every corpus's inotify instance, each after its running search; a later search starts afresh.

        A running first build is ended first (its builder process killed, an index being read in a thread given up),
        so the search holding the corpus returns at once instead of holding the daemon's stop for minutes.
        """
        self._build_stop.stop()
        self._build_stop = BuildStop()
        folders, self._folders = self._folders, {}
        for entry in folders.values():
            async with entry.lock:
                entry.corpus.close()

    async def search(
        self, folder: str, query: str, *, top_k: int, sources: Sources = "all", db: Database | None = None
    ) -> list[dict[str, Any]]:
        """The best memory chunks of `folder` (and the global memory) and chat messages, on one BM25 score.

        Args:
            folder: The group folder searched (access was checked by the caller).
            query: Free text.
            top_k: At most this many hits.
            sources: Which kinds of hits to return; both are scored together whichever is asked for.
            db: The daemon's database, where the folder's chats are; None searches no chat.
        """
        entry = self._folder(folder)
        await entry.lock.acquire()
        try:
            update = entry.window.plan(db)  # on the loop: the daemon's connection is the loop's
            path = None if db is None else db.path
            # Warm, nothing to read and a small corpus: the ranking alone (about 0.6 ms at 10,000 documents), here;
            # a thread would only add its hand-offs. A larger corpus ranks in a thread, whose GIL switches let the
            # loop serve other groups every few milliseconds meanwhile.
            inline = (
                entry.corpus.documents <= INLINE_SEARCH_DOCUMENTS
                and entry.corpus.is_current()
                and not entry.window.reads(update, path)
            )
            if inline:
                hits = self._search_sync(entry, update, path, query, top_k, sources)
        except BaseException:
            entry.lock.release()
            raise
        if inline:
            entry.lock.release()
            return [_document(folder, hit) for hit in hits]
        try:
            job = asyncio.ensure_future(
                asyncio.to_thread(self._search_sync, entry, update, path, query, top_k, sources)
            )
        except BaseException:
            entry.lock.release()
            raise
        # A thread cannot be stopped: a search given up (its request timed out) keeps the corpus until it is done.
        job.add_done_callback(lambda done: _release(entry.lock, done))
        hits = await asyncio.shield(job)
        return [_document(folder, hit) for hit in hits]

    def stats(self, folder: str) -> tuple[CorpusStats, WindowStats] | None:
        """The counters of a folder's corpus and window, once it was searched."""
        entry = self._folders.get(folder)
        return None if entry is None else (entry.corpus.stats, entry.window.stats)

    def _folder(self, folder: str) -> _Folder:
        if folder not in self._folders:
            roots = {folder: self._layout.workspace(folder)}
            if folder != GLOBAL_MEMORY_FOLDER:
                roots[GLOBAL_MEMORY_FOLDER] = self._layout.workspace(GLOBAL_MEMORY_FOLDER)
            window = SessionWindow(folder, limit=self._session_limit)
            snapshot = self._layout.create_memory_index() / f"{folder}{SUFFIX}"
            corpus = MemoryCorpus(
                roots,
                name=folder,
                snapshot=snapshot,
                build_timeout=self._build_timeout,
                build_stop=self._build_stop,
            )
            self._folders[folder] = _Folder(corpus, window, asyncio.Lock())
        return self._folders[folder]

    @staticmethod
    def _search_sync(
        entry: _Folder, update: SessionUpdate, db_path: Path | None, query: str, top_k: int, sources: Sources
    ) -> list[MemoryHit | SessionHit]:
        """In the worker thread: the first build of a corpus and the load of a window are slow."""
        entry.window.apply(entry.corpus, update, db_path)
        return entry.corpus.search(
            query, top_k, PER_FILE_CAP, memory=sources != "sessions", sessions=sources != "memory"
        )


def _release(lock: asyncio.Lock, job: asyncio.Future[Any]) -> None:
    lock.release()
    if not job.cancelled():
        job.exception()  # retrieved here too, so a search nobody waits for any more logs no "never retrieved"


def _document(folder: str, hit: MemoryHit | SessionHit) -> dict[str, Any]:
    if isinstance(hit, SessionHit):
        return {
            "source": "session",
            "score": round(hit.score, 6),
            "groupFolder": folder,
            "chatJid": hit.doc.chat_jid,
            "sender": hit.doc.sender,
            "timestamp": _wire_stamp(hit.doc.sent_at),
            "snippet": hit.snippet,
        }
    return {
        "source": "memory",
        "score": round(hit.score, 6),
        "groupFolder": hit.root,
        "path": hit.path,
        "startLine": hit.start_line,
        "endLine": hit.end_line,
        "citation": hit.citation,
        "snippet": hit.snippet,
    }


def _wire_stamp(stored: str) -> str:
    """The contract's timestamp of a stored `sent_at` (parsed for hits only, never for the whole window)."""
    sent = parse_iso(stored)
    assert sent is not None
    return utc_stamp(sent)


def memory_handlers(service: MemoryService) -> Handlers:
    """The memory_action rows: search through `service`, and memory_get."""

    async def memory_search(ctx: RequestContext, request: AnyRequest) -> Outcome:
        assert isinstance(request, MemoryActionRequest)
        p = parse_params(MemorySearchParams, request.params, "memory_search")
        query, top_k, sources = p.query, p.topK, p.sources
        folder = target_folder(ctx, p.groupFolder, request.groupFolder)
        hits = await service.search(folder, query, top_k=top_k, sources=sources, db=ctx.db)
        return Outcome(result={"hits": hits})

    return {
        "memory_action:memory_search": HandlerSpec(effect=Effect.READ, run=memory_search),
        "memory_action:memory_get": HandlerSpec(effect=Effect.READ, run=memory_get),
    }
