"""The cached markdown memory corpus of a set of workspaces: symlink-safe file walk, per-file chunk cache, search."""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from farmhost.memory.bm25 import Bm25Index, SegmentKey
from farmhost.memory.chunker import DEFAULT_MAX_CHARS, Chunk, chunk_markdown
from farmhost.memory.tokenize import tokenize

MEMORY_FILE: Final = "MEMORY.md"
MEMORY_DIR: Final = "memory"
# Bounds on what an agent can make the host read: memory is notes, not a data lake.
MAX_FILE_BYTES: Final = 1 << 20
MAX_FILES_PER_ROOT: Final = 2000
MAX_DEPTH: Final = 16
SNIPPET_CHARS: Final = 300
# Segment kinds in the BM25 index; "memory" < "session" puts memory first among equal scores.
_MEMORY: Final = "memory"
_SESSION: Final = "session"

_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# Progress of a long (re)index: logged when a refresh has more than this many files to read, or takes longer than
# this; then at most every PROGRESS_EVERY_SECONDS, and a summary at the end.
PROGRESS_FILES: Final = 200
PROGRESS_AFTER_SECONDS: Final = 1.0
PROGRESS_EVERY_SECONDS: Final = 2.0

logger = logging.getLogger(__name__)

Signature = tuple[int, int, int, int]  # (inode, size, mtime_ns, ctime_ns)


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
    """A chat message searched beside the memory files, in the same BM25 index (so scores compare)."""

    id: int
    text: str
    chat_jid: str
    sender: str | None
    timestamp: str


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


@dataclass(slots=True)
class _FileEntry:
    signature: Signature
    chunks: list[Chunk]


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _walk_md(dir_fd: int, prefix: str, depth: int) -> Iterator[tuple[str, Signature]]:
    """Regular `*.md` files under an open directory, never following a symlink; sorted by name."""
    if depth > MAX_DEPTH:
        return
    with os.scandir(dir_fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        rel = f"{prefix}/{entry.name}"
        if stat.S_ISDIR(st.st_mode):
            try:
                sub_fd = os.open(entry.name, _OPEN_DIR, dir_fd=dir_fd)
            except OSError:
                continue  # a symlink swapped in since the stat, or gone: skip
            try:
                yield from _walk_md(sub_fd, rel, depth + 1)
            finally:
                os.close(sub_fd)
        elif stat.S_ISREG(st.st_mode) and entry.name.endswith(".md"):
            yield rel, _signature(st)


def _list_root(root: Path) -> dict[str, Signature]:
    """Memory files of one workspace root and their signatures; symlinks (files or dirs) are skipped."""
    found: dict[str, Signature] = {}
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return found
    try:
        try:
            st = os.stat(MEMORY_FILE, dir_fd=root_fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                found[MEMORY_FILE] = _signature(st)
        except OSError:
            pass
        try:
            mem_fd = os.open(MEMORY_DIR, _OPEN_DIR, dir_fd=root_fd)
        except OSError:
            return found
        try:
            for rel, sig in _walk_md(mem_fd, MEMORY_DIR, 1):
                if len(found) >= MAX_FILES_PER_ROOT:
                    break
                found[rel] = sig
        finally:
            os.close(mem_fd)
    finally:
        os.close(root_fd)
    return found


class _Progress:
    """Log lines for one refresh that reads many files or takes long; silent for the usual small refresh."""

    def __init__(self, name: str, total: int, *, files: int, after: float, every: float) -> None:
        self._name, self._total, self._after, self._every = name, total, after, every
        self._started = self._last = time.monotonic()
        self._active = total > files
        if self._active:
            self._line(0)

    def step(self, done: int) -> None:
        now = time.monotonic()
        if self._active and now - self._last < self._every:
            return
        if not self._active and now - self._started < self._after:
            return
        self._active, self._last = True, now
        self._line(done)

    def finish(self, done: int, chunks: int) -> None:
        if not self._active:
            return
        took = time.monotonic() - self._started
        logger.info(
            "indexed memory of group %s: %s files, %s chunks in %.1f s",
            self._name,
            f"{done:,}",
            f"{chunks:,}",
            took,
            extra={
                "group": self._name,
                "event": "memory_indexed",
                "files": done,
                "chunks": chunks,
                "seconds": round(took, 3),
            },
        )

    def _line(self, done: int) -> None:
        logger.info(
            "indexing memory of group %s: %s/%s files",
            self._name,
            f"{done:,}",
            f"{self._total:,}",
            extra={"group": self._name, "event": "memory_indexing", "done": done, "files": self._total},
        )


def read_memory_file(root: Path, rel: str) -> str | None:
    """Read a memory file relative to `root`, opening every path component with O_NOFOLLOW.

    Args:
        root: The workspace directory (trusted, may itself be reached through a link).
        rel: A "/"-separated relative path such as "memory/fields/north.md".

    Returns:
        The text (invalid UTF-8 replaced, at most MAX_FILE_BYTES read), or None when the file is
        missing, is not a regular file, or any component is a symlink.
    """
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for part in parts[:-1]:
            fds.append(os.open(part, _OPEN_DIR, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], _OPEN_FILE, dir_fd=fds[-1]))
        if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
            return None
        with os.fdopen(os.dup(fds[-1]), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ENXIO, errno.EISDIR):
            return None
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return data.decode("utf-8", errors="replace")


def snippet(text: str, query_tokens: set[str], width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` starting a little before its line sharing most query tokens."""
    lines = text.split("\n")
    best_hits, offset, best_offset = -1, 0, 0
    for line in lines:
        hits = len(query_tokens.intersection(tokenize(line)))
        if hits > best_hits:
            best_hits, best_offset = hits, offset
        offset += len(line) + 1
    if len(text) <= width:
        return text.strip()
    start = max(0, min(best_offset - width // 4, len(text) - width))
    piece = text[start : start + width].strip()
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


class MemoryCorpus:
    """BM25 search over the markdown memory (`MEMORY.md`, `memory/**/*.md`) of several workspace roots.

    Each file is one segment of an incremental BM25 index, cached by its (inode, size, mtime_ns,
    ctime_ns): every search re-stats the files, then re-reads, re-chunks and re-indexes only the
    new or changed ones and drops removed ones, so an edit costs in proportion to the edited file.
    Chat messages are segments of the same index, so memory and session scores compare.
    Not thread-safe: use one instance from one thread (the daemon's event loop via to_thread).
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
        self._sessions: dict[int, SessionDoc] = {}
        self.stats = CorpusStats()

    def _changed_files(self, number: int, label: str) -> list[tuple[str, Signature]]:
        """Drop the files of one root that are gone; return the new or changed ones, to be read."""
        files = self._files[label]
        current = _list_root(self._roots[label])
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

    def _refresh_sessions(self, sessions: tuple[SessionDoc, ...]) -> None:
        wanted = {doc.id: doc for doc in sessions}
        for gone in [i for i in self._sessions if i not in wanted]:
            del self._sessions[gone]
            self._index.remove((_SESSION, gone, ""))
        for doc_id, doc in wanted.items():
            if self._sessions.get(doc_id) != doc:
                self._sessions[doc_id] = doc
                self._index.put((_SESSION, doc_id, ""), [tokenize(doc.text)])
                self.stats.segments_indexed += 1

    def refresh(self, sessions: tuple[SessionDoc, ...] = ()) -> None:
        """Bring the index up to date with the files and these chat messages (a search does this itself)."""
        changed = [(number, label, self._changed_files(number, label)) for number, label in enumerate(self._labels)]
        progress = _Progress(
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
        self._refresh_sessions(sessions)

    def search(
        self, query_text: str, top_k: int = 8, per_file_cap: int = 3, sessions: tuple[SessionDoc, ...] = ()
    ) -> list[MemoryHit | SessionHit]:
        """The best-matching chunks for a free-text query.

        Args:
            query_text: What to look for, in any script.
            top_k: At most this many hits.
            per_file_cap: At most this many hits from one file, so one long file cannot crowd out the rest.
            sessions: Chat messages indexed beside the memory chunks, so memory and session scores compare.

        Returns:
            Hits by score descending, ties in root order, then path, then line, then sessions by
            message id (deterministic).
        """
        self.stats.searches += 1
        self.refresh(sessions)
        tokens = tokenize(query_text)
        if not tokens or top_k <= 0:
            return []
        token_set = set(tokens)
        per_file: dict[SegmentKey, int] = {}
        hits: list[MemoryHit | SessionHit] = []
        for key, position, score in self._index.ranked(tokens, batch=top_k):
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
