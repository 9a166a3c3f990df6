"""memory_search: BM25 over a group's markdown memory and the global memory, one cached corpus per group."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from farmhost.ipc.handlers import Effect, Handlers, HandlerSpec, RequestContext
from farmhost.layout import GLOBAL_MEMORY_FOLDER, DataLayout
from farmhost.memory.access import target_folder
from farmhost.memory.corpus import MemoryCorpus, MemoryHit, SessionDoc, SessionHit
from farmhost.memory.get import memory_get
from farmhost.protocol.envelope import Outcome, utc_stamp
from farmhost.protocol.params import MAX_TOP_K, MemorySearchParams, parse_params
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest
from farmhost.store import groups, transcripts

# One long file must not crowd out the rest of the memory.
PER_FILE_CAP: Final = 3


class MemoryService:
    """Keeps one MemoryCorpus per searched folder; each is rebuilt only for the files that changed.

    A folder is searched by its own group, by main (any registered group) or for an agent run's prompt, so
    there is at most one corpus per registered group plus one for `global`; each holds one inotify
    instance (`watch.py`) until `close()`.
    """

    def __init__(self, layout: DataLayout) -> None:
        self._layout = layout
        self._corpora: dict[str, tuple[MemoryCorpus, asyncio.Lock]] = {}

    async def close(self) -> None:
        """Release every corpus's inotify instance, each after its running search; a later search starts afresh."""
        corpora, self._corpora = self._corpora, {}
        for corpus, lock in corpora.values():
            async with lock:
                corpus.close()

    async def search(
        self, folder: str, query: str, *, top_k: int, sessions: tuple[SessionDoc, ...] = (), memory: bool = True
    ) -> list[dict[str, Any]]:
        """The best memory chunks of `folder` (and the global memory) and chat messages, on one BM25 score."""
        roots = {folder: self._layout.workspace(folder)}
        if folder != GLOBAL_MEMORY_FOLDER:
            roots[GLOBAL_MEMORY_FOLDER] = self._layout.workspace(GLOBAL_MEMORY_FOLDER)
        if folder not in self._corpora:
            self._corpora[folder] = (MemoryCorpus(roots, name=folder), asyncio.Lock())
        corpus, lock = self._corpora[folder]
        async with lock:  # a corpus is not thread-safe: one search at a time, in a thread (the first build is slow)
            # Memory-only hits are still scored against the sessions too, so both kinds share one scale.
            wanted = top_k if memory else top_k + MAX_TOP_K
            hits = await asyncio.to_thread(corpus.search, query, wanted, PER_FILE_CAP, sessions)
        documents = [_document(folder, hit) for hit in hits]
        if not memory:
            documents = [d for d in documents if d["source"] == "session"]
        return documents[:top_k]


def _document(folder: str, hit: MemoryHit | SessionHit) -> dict[str, Any]:
    if isinstance(hit, SessionHit):
        return {
            "source": "session",
            "score": round(hit.score, 6),
            "groupFolder": folder,
            "chatJid": hit.doc.chat_jid,
            "sender": hit.doc.sender,
            "timestamp": hit.doc.timestamp,
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


def session_docs(ctx: RequestContext, folder: str) -> tuple[SessionDoc, ...]:
    """The recent messages of the chats bound to `folder` (transcripts are per chat; a group has one chat)."""
    jids = [g.jid for g in groups.list_groups(ctx.db.conn) if g.folder == folder]
    return tuple(
        SessionDoc(id=m.id, text=m.text, chat_jid=m.chat_jid, sender=m.sender, timestamp=utc_stamp(m.sent_at))
        for m in transcripts.recent(ctx.db.conn, jids)
    )


def memory_handlers(service: MemoryService) -> Handlers:
    """The memory_action rows: search through `service`, and memory_get."""

    async def memory_search(ctx: RequestContext, request: AnyRequest) -> Outcome:
        assert isinstance(request, MemoryActionRequest)
        p = parse_params(MemorySearchParams, request.params, "memory_search")
        query, top_k, sources = p.query, p.topK, p.sources
        folder = target_folder(ctx, p.groupFolder, request.groupFolder)
        sessions = session_docs(ctx, folder) if sources != "memory" else ()
        hits = await service.search(folder, query, top_k=top_k, sessions=sessions, memory=sources != "sessions")
        return Outcome(result={"hits": hits})

    return {
        "memory_action:memory_search": HandlerSpec(effect=Effect.READ, run=memory_search),
        "memory_action:memory_get": HandlerSpec(effect=Effect.READ, run=memory_get),
    }
