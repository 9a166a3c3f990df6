"""The cached markdown memory corpus of a set of workspaces: per-file chunk cache, BM25 search, hits.

With a snapshot path, a corpus's first refresh starts from the persisted index (`snapshot.py`) when it fits
the files (only files changed since are read), and has a large first index built by the builder process
(`builder.py`) rather than on its own thread.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.memory.bm25 import Bm25Index, SegmentKey
from farmhost.memory.chunker import DEFAULT_MAX_CHARS, Chunk, chunk_markdown
from farmhost.memory.files import Signature, read_memory_file
from farmhost.memory.indexer_process import BUILD_TIMEOUT_SECONDS, BuildError, BuildStop, BuildStopped, run_builder
from farmhost.memory.progress import PROGRESS_AFTER_SECONDS, PROGRESS_EVERY_SECONDS, PROGRESS_FILES, IndexProgress
from farmhost.memory.snapshot import Snapshot, SnapshotError, identity, open_snapshot, write_snapshot
from farmhost.memory.snippet import snippet
from farmhost.memory.tokenize import tokenize
from farmhost.memory.watch import MemoryWatch

# Segment kinds in the BM25 index; "memory" < "session" puts memory first among equal scores.
_MEMORY: Final = "memory"
_SESSION: Final = "session"
# A first index reading more than this (files, or bytes) is built by the builder process, not in this thread.
PROCESS_FILES: Final = 64
PROCESS_BYTES: Final = 1 << 20

logger = logging.getLogger(__name__)


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
    snapshots_loaded: int = 0
    snapshots_built: int = 0  # by the builder process
    snapshots_rejected: int = 0  # damaged, or built for another format, code, roots or chunk size
    files_from_snapshot: int = 0  # files a loaded snapshot held unchanged (not read, not chunked)


@dataclass(slots=True)
class _FileEntry:
    signature: Signature
    chunks: list[Chunk] | None  # None: the file is as the snapshot holds it, its chunks read from there per hit
    first_doc: int = 0  # its first document in the snapshot


_Changed = tuple[int, str, list[tuple[str, Signature]]]  # (root number, label, files to read)


def _needs_process(signatures: Sequence[Signature]) -> bool:
    return len(signatures) > PROCESS_FILES or sum(sig[1] for sig in signatures) > PROCESS_BYTES


def _release(watch: MemoryWatch, held: list[Snapshot]) -> None:
    watch.close()
    while held:
        held.pop().close()


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
        snapshot: Path | None = None,
        build_timeout: float = BUILD_TIMEOUT_SECONDS,
        build_stop: BuildStop | None = None,
        inotify: bool = True,
    ) -> None:
        """Create an empty corpus; nothing is read until the first search.

        Args:
            roots: Label (e.g. a group folder, or "global") -> workspace directory, in search order.
            max_chunk_chars: The chunker's size cap.
            name: The group named in progress lines (default: the first root's label).
            progress_files: A refresh with more files than this to read logs its progress from the start.
            progress_after: A refresh still reading after this many seconds logs its progress from then on.
            progress_every: At most one progress line per this many seconds (then one summary line).
            snapshot: The persisted index file to start from and to have built; None: always built in this thread.
            build_timeout: Seconds the builder process may take before this thread builds the index itself.
            build_stop: The daemon's stop: it ends the builder process, and a refresh gives up between two files.
            inotify: False for a corpus listed once (the builder's): every search re-lists every root.
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
        self._snapshot_path = snapshot
        self._build_timeout = build_timeout
        self._build_stop = build_stop
        self._snapshot: list[Snapshot] = []  # the one loaded, while its chunks are in use
        self._started = False  # the first refresh (the one that may load a snapshot) is done
        self._watch = MemoryWatch(self._name, inotify=inotify)
        self._root_watches = {label: self._watch.root(path) for label, path in self._roots.items()}
        self._finalizer = weakref.finalize(self, _release, self._watch, self._snapshot)

    def close(self) -> None:
        """Release the inotify instance and the snapshot file; then unusable for a snapshot-backed corpus."""
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
        if not self._started:
            self.refresh()  # a snapshot is loaded into an empty index, before any message
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

    @property
    def documents(self) -> int:
        """How many documents (chunks and chat messages) the index holds: what one ranking's cost grows with."""
        return self._index.size

    def is_current(self) -> bool:
        """Whether a search would read nothing first: started, and no root changed or due for a listing.

        Then a search is the ranking alone (well under a millisecond at 10,000 chunks), which the caller may run
        where it is, without a thread hop.
        """
        if not self._started:
            return False
        self._watch.poll()
        return not any(watch.dirty for watch in self._root_watches.values())

    def refresh(self, on_file: Callable[[int], None] | None = None) -> tuple[int, int]:
        """Bring the index up to date with the files (a search does this itself).

        Args:
            on_file: Called with the number of files read so far after each file read.

        Returns:
            (files read, chunks they hold).

        Raises:
            BuildStopped: the daemon is stopping (`build_stop`); the index is left part-built.
        """
        self._watch.poll()
        changed = [(number, label, self._changed_files(number, label)) for number, label in enumerate(self._labels)]
        if not self._started:
            self._started = True
            if self._snapshot_path is not None:
                changed = self._start_from_snapshot(changed, self._snapshot_path)
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
                if self._build_stop is not None and self._build_stop.requested:
                    raise BuildStopped(f"indexing the memory of group {self._name} was stopped with the daemon")
                chunks += self._index_file(number, label, rel, sig)
                done += 1
                progress.step(done)
                if on_file is not None:
                    on_file(done)
        progress.finish(done, chunks)
        return done, chunks

    def _start_from_snapshot(self, changed: list[_Changed], path: Path) -> list[_Changed]:
        """Load the snapshot (built by the builder process first when too much is to read); what is left to read."""
        listing = {(number, rel): sig for number, _, files in changed for rel, sig in files}
        started = time.perf_counter()
        snap = self._open_snapshot(path)
        if snap is not None:
            held = {(file.root, file.rel): file.signature for file in snap.files}
            stale = [sig for where, sig in listing.items() if held.get(where) != sig]
            if _needs_process(stale):
                logger.info(
                    "memory index of group %s: %s files changed since it was saved; rebuilding it",
                    self._name,
                    f"{len(stale):,}",
                    extra={"group": self._name, "event": "memory_snapshot_stale", "files": len(stale)},
                )
                snap.close()
                snap = None
        if snap is None and _needs_process(list(listing.values())):
            snap = self._build_snapshot(path, len(listing))
        if snap is None:
            return changed
        adopted = self._adopt(snap, listing)
        left = [
            (n, label, [(rel, sig) for rel, sig in files if (n, rel) not in adopted]) for n, label, files in changed
        ]
        logger.info(
            "memory index of group %s loaded: %s files from the snapshot, %s to read, in %.0f ms",
            self._name,
            f"{len(adopted):,}",
            f"{len(listing) - len(adopted):,}",
            (time.perf_counter() - started) * 1000,
            extra={"group": self._name, "event": "memory_snapshot_loaded", "files": len(adopted),
                   "stale": len(listing) - len(adopted)},
        )  # fmt: skip
        return left

    def _open_snapshot(self, path: Path) -> Snapshot | None:
        if not path.exists():
            return None
        try:
            return open_snapshot(path, identity(self._roots, self._max_chunk_chars), len(self._labels))
        except SnapshotError as exc:
            self.stats.snapshots_rejected += 1
            logger.warning(
                "memory index of group %s cannot be used (%s); building it anew",
                self._name,
                exc,
                extra={"group": self._name, "event": "memory_snapshot_rejected", "reason": str(exc)},
            )
            path.unlink(missing_ok=True)
            return None

    def _build_snapshot(self, path: Path, total: int) -> Snapshot | None:
        progress = IndexProgress(
            self._name, total, files=self._progress_files, after=self._progress_after, every=self._progress_every
        )
        try:
            files, chunks = run_builder(
                self._roots,
                path,
                max_chunk_chars=self._max_chunk_chars,
                name=self._name,
                timeout=self._build_timeout,
                on_progress=progress.step,
                stop=self._build_stop,
            )
        except BuildError as exc:
            logger.warning(
                "%s; indexing the memory of group %s in the daemon instead (other groups may wait meanwhile)",
                exc,
                self._name,
                extra={"group": self._name, "event": "memory_build_failed", "reason": str(exc)},
            )
            return None
        progress.finish(files, chunks)
        self.stats.snapshots_built += 1
        return self._open_snapshot(path)

    def _adopt(self, snap: Snapshot, listing: Mapping[tuple[int, str], Signature]) -> set[tuple[int, str]]:
        """Start the index from the snapshot; its files that changed or are gone are dropped from it."""
        self._index = Bm25Index(snap.frozen)  # the first refresh: nothing else is held yet
        self._snapshot.append(snap)
        self.stats.snapshots_loaded += 1
        adopted: set[tuple[int, str]] = set()
        for file in snap.files:
            if listing.get((file.root, file.rel)) == file.signature:
                entry = _FileEntry(file.signature, None, file.first_doc)
                self._files[self._labels[file.root]][file.rel] = entry
                adopted.add((file.root, file.rel))
            else:
                self._index.remove((_MEMORY, file.root, file.rel))
        self.stats.files_from_snapshot += len(adopted)
        return adopted

    def save_snapshot(self, path: Path) -> None:
        """Write the index and chunks of the files as a snapshot (the builder's job; no chat messages held).

        Raises:
            ValueError: messages are held, or a file's chunks were not read by this corpus.
        """
        frozen = self._index.freeze()
        files = []
        for _, number, rel in frozen.keys:
            entry = self._files[self._labels[number]][rel]
            if entry.chunks is None:
                raise ValueError("a file of a loaded snapshot cannot be saved again")
            files.append((number, rel, entry.signature, entry.chunks))
        write_snapshot(path, identity(self._roots, self._max_chunk_chars), files, frozen)

    def _chunk(self, label: str, rel: str, position: int) -> Chunk:
        entry = self._files[label][rel]
        if entry.chunks is not None:
            return entry.chunks[position]
        return self._snapshot[0].chunk(entry.first_doc + position, rel)

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
                chunk = self._chunk(label, rel, position)
                text = snippet(chunk.text, token_set)
                hits.append(MemoryHit(label, chunk.path, chunk.start_line, chunk.end_line, text, score))
            if len(hits) >= top_k:
                break
        return hits
