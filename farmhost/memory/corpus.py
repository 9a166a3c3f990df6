"""The cached markdown memory corpus of a set of workspaces: per-file chunk cache, BM25 search, hits."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.memory.bm25 import Bm25Index, SegmentKey
from farmhost.memory.chunker import DEFAULT_MAX_CHARS, Chunk, chunk_markdown
from farmhost.memory.files import Signature, read_memory_file
from farmhost.memory.progress import PROGRESS_AFTER_SECONDS, PROGRESS_EVERY_SECONDS, PROGRESS_FILES, IndexProgress
from farmhost.memory.snippet import snippet
from farmhost.memory.tokenize import tokenize
from farmhost.memory.watch import MemoryWatch

# Segment kinds in the BM25 index; "memory" < "session" puts memory first among equal scores.
_MEMORY: Final = "memory"
_SESSION: Final = "session"


@dataclass(frozen=True, slots=True)
class MemoryHit:
    """One search result: a chunk of a memory file.

    Attributes:
        root: The label of the root the file is in (a group folder, or the global memory's label).
        path: The file's path relative to its root, with "/" separators ("MEMORY.md", "memory/x.md").
        start_line: First line of the chunk, 1-based.
        end_line: Last line of the chunk, 1-based inclusive.
        snippet: At most about 300 characters of the chunk around its best-matching line.
        score: The BM25 score (> 0); comparable between hits of one search only.
    """

    root: str
    path: str
    start_line: int
    end_line: int
    snippet: str
    score: float

    @property
    def citation(self) -> str:
        """`path#Lx-Ly`, the form an agent quotes."""
        return f"{self.path}#L{self.start_line}-L{self.end_line}"


@dataclass(frozen=True, slots=True)
class SessionDoc:
    """A chat message searched beside the memory files, in the same BM25 index (so scores compare).

    Attributes:
        id: The transcript row's id (messages are added in id order; ties in score break by it).
        sent_at: When it was sent, as the transcript stores it (not parsed: only hits are shown).
    """

    id: int
    text: str
    chat_jid: str
    sender: str | None
    sent_at: str


@dataclass(frozen=True, slots=True)
class SessionHit:
    """One search result from the chat transcript."""

    doc: SessionDoc
    snippet: str
    score: float


@dataclass(slots=True)
class CorpusStats:
    """Counters that show how much work the cache saved (observable by tests and the benchmark)."""

    files_chunked: int = 0
    segments_indexed: int = 0
    searches: int = 0
    listings: int = 0  # roots listed (one stat per file); a search lists only the roots whose watch says dirty
    sessions_indexed: int = 0
    sessions_evicted: int = 0


@dataclass(slots=True)
class _FileEntry:
    signature: Signature
    chunks: list[Chunk]


class MemoryCorpus:
    """BM25 search over the markdown memory (`MEMORY.md`, `memory/**/*.md`) of several workspace roots.

    Each file is one segment of an incremental BM25 index, cached by its (inode, size, mtime_ns,
    ctime_ns). A search lists (re-stats) only the roots whose inotify watch (`watch.py`) says something
    may have changed, then re-reads, re-chunks and re-indexes only the new or changed files and drops
    removed ones, so an edit costs in proportion to the edited file.
    Chat messages are segments of the same index, so memory and session scores compare; the caller
    adds the new ones (`add_sessions`) and the oldest leave as the window slides, so a search costs
    in proportion to the messages that are new, not to the window.
    Not thread-safe: use one instance from one thread at a time (the daemon's, via to_thread under a lock).
    `close()` releases the inotify instance (a finalizer does it when the corpus is dropped).
    """

    def __init__(
        self,
        roots: Mapping[str, Path],
        *,
        max_chunk_chars: int = DEFAULT_MAX_CHARS,
        name: str | None = None,
        progress_files: int = PROGRESS_FILES,
        progress_after: float = PROGRESS_AFTER_SECONDS,
        progress_every: float = PROGRESS_EVERY_SECONDS,
    ) -> None:
        """Create an empty corpus; nothing is read until the first search.

        Args:
            roots: Label (e.g. a group folder, or "global") -> workspace directory, in search order.
            max_chunk_chars: The chunker's size cap.
            name: The group named in progress lines (default: the first root's label).
            progress_files: A refresh with more files than this to read logs its progress from the start.
            progress_after: A refresh still reading after this many seconds logs its progress from then on.
            progress_every: At most one progress line per this many seconds (then one summary line).
        """
        self._roots = dict(roots)
        self._name = name or next(iter(self._roots), "?")
        self._progress_files = progress_files
        self._progress_after = progress_after
        self._progress_every = progress_every
        self._labels = list(self._roots)
        self._max_chunk_chars = max_chunk_chars
        self._files: dict[str, dict[str, _FileEntry]] = {label: {} for label in self._roots}
        self._index = Bm25Index()
        self._sessions: dict[int, SessionDoc] = {}  # in id order, oldest first
        self.stats = CorpusStats()
        self._watch = MemoryWatch(self._name)
        self._root_watches = {label: self._watch.root(path) for label, path in self._roots.items()}
        self._finalizer = weakref.finalize(self, self._watch.close)

    def close(self) -> None:
        """Release the inotify instance; the corpus stays usable and then re-lists every root at every search."""
        self._finalizer()

    def _changed_files(self, number: int, label: str) -> list[tuple[str, Signature]]:
        """Drop the files of one root that are gone; return the new or changed ones, to be read."""
        watch = self._root_watches[label]
        if not watch.dirty:
            return []
        files = self._files[label]
        current = watch.list()
        self.stats.listings += 1
        for rel in [r for r in files if r not in current]:
            del files[rel]
            self._index.remove((_MEMORY, number, rel))
        return [(rel, sig) for rel, sig in current.items() if (e := files.get(rel)) is None or e.signature != sig]

    def _index_file(self, number: int, label: str, rel: str, sig: Signature) -> int:
        """(Re)read, chunk and index one file; returns its number of chunks."""
        files = self._files[label]
        text = read_memory_file(self._roots[label], rel)
        if text is None:
            files.pop(rel, None)
            self._index.remove((_MEMORY, number, rel))
            return 0
        chunks = chunk_markdown(rel, text, self._max_chunk_chars)
        self.stats.files_chunked += 1
        files[rel] = _FileEntry(sig, chunks)
        self._index.put((_MEMORY, number, rel), [tokenize(c.text) for c in chunks])
        self.stats.segments_indexed += 1
        return len(chunks)

    def add_sessions(self, docs: Sequence[SessionDoc], *, keep: int) -> None:
        """Index chat messages newer than every one held, then evict the oldest beyond `keep`.

        Raises:
            ValueError: a message is not newer than the newest one held (the caller lost track).
        """
        newest = next(reversed(self._sessions), 0)
        for doc in docs:
            if doc.id <= newest:
                raise ValueError(f"session {doc.id} is not newer than {newest}: reload the window instead")
            newest = doc.id
            self._sessions[doc.id] = doc
            self._index.put((_SESSION, doc.id, ""), [tokenize(doc.text)])
            self.stats.sessions_indexed += 1
            self.stats.segments_indexed += 1
        while len(self._sessions) > keep:
            oldest = next(iter(self._sessions))
            del self._sessions[oldest]
            self._index.remove((_SESSION, oldest, ""))
            self.stats.sessions_evicted += 1

    def clear_sessions(self) -> None:
        """Drop every chat message (before a window is loaded anew)."""
        for doc_id in self._sessions:
            self._index.remove((_SESSION, doc_id, ""))
        self.stats.sessions_evicted += len(self._sessions)
        self._sessions.clear()

    def session_span(self) -> tuple[int, int, int]:
        """(how many messages are held, the oldest id, the newest id); (0, 0, 0) when none."""
        if not self._sessions:
            return 0, 0, 0
        return len(self._sessions), next(iter(self._sessions)), next(reversed(self._sessions))

    def refresh(self) -> None:
        """Bring the index up to date with the files (a search does this itself)."""
        self._watch.poll()
        changed = [(number, label, self._changed_files(number, label)) for number, label in enumerate(self._labels)]
        progress = IndexProgress(
            self._name,
            sum(len(files) for _, _, files in changed),
            files=self._progress_files,
            after=self._progress_after,
            every=self._progress_every,
        )
        done = chunks = 0
        for number, label, files in changed:
            for rel, sig in files:
                chunks += self._index_file(number, label, rel, sig)
                done += 1
                progress.step(done)
        progress.finish(done, chunks)

    def search(
        self, query_text: str, top_k: int = 8, per_file_cap: int = 3, *, memory: bool = True, sessions: bool = True
    ) -> list[MemoryHit | SessionHit]:
        """The best-matching chunks for a free-text query.

        Args:
            query_text: What to look for, in any script.
            top_k: At most this many hits.
            per_file_cap: At most this many hits from one file, so one long file cannot crowd out the rest.
            memory: Return memory chunks.
            sessions: Return chat messages. Both kinds are scored together whichever are returned, so a
                hit has the same score whatever the caller asked for.

        Returns:
            Hits by score descending, ties in root order, then path, then line, then sessions by
            message id (deterministic).
        """
        self.stats.searches += 1
        self.refresh()
        tokens = tokenize(query_text)
        if not tokens or top_k <= 0 or not (memory or sessions):
            return []
        only = None if memory and sessions else _MEMORY if memory else _SESSION
        token_set = set(tokens)
        per_file: dict[SegmentKey, int] = {}
        hits: list[MemoryHit | SessionHit] = []
        for key, position, score in self._index.ranked(tokens, batch=top_k, kind=only):
            kind, number, rel = key
            if kind == _SESSION:
                doc = self._sessions[number]
                hits.append(SessionHit(doc, snippet(doc.text, token_set), score))
            elif per_file.get(key, 0) < per_file_cap:
                per_file[key] = per_file.get(key, 0) + 1
                label = self._labels[number]
                chunk = self._files[label][rel].chunks[position]
                text = snippet(chunk.text, token_set)
                hits.append(MemoryHit(label, chunk.path, chunk.start_line, chunk.end_line, text, score))
            if len(hits) >= top_k:
                break
        return hits
