"""The persisted memory index of one group: a host-private SQLite file holding a frozen index, its files and chunks.

Written whole by the builder process (`build.py`) to a temporary name and renamed into place, so a reader sees
the old file or the new one. Opening one checks everything a search will rely on before any of it is used (the
format and the farmhost that wrote it, the roots and chunk size it was built for, the arrays' consistency, one
chunk row per document); anything wrong raises `SnapshotError` and the caller rebuilds. No pickle: arrays are
little-endian blobs, the vocabulary is text. Chunk texts stay in the file and are read per hit, so loading costs
no Python object per chunk.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from farmhost import __version__
from farmhost.memory import bm25, chunker, tokenize
from farmhost.memory import frozen as frozen_module
from farmhost.memory.chunker import Chunk
from farmhost.memory.files import Signature
from farmhost.memory.frozen import FrozenIndex

# Bump when what a snapshot holds or how chunks and tokens are made changes without a farmhost version change.
FORMAT_VERSION: Final = 1
SUFFIX: Final = ".sqlite"

_SCHEMA: Final = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE file (
    seg INTEGER PRIMARY KEY, root INTEGER NOT NULL, rel TEXT NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, chunks INTEGER NOT NULL
);
CREATE TABLE chunk (
    doc INTEGER PRIMARY KEY, start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, heading TEXT, text TEXT NOT NULL
);
CREATE TABLE array (name TEXT PRIMARY KEY, data BLOB NOT NULL);
"""
_ARRAYS: Final = {"counts": "<i8", "doc_len": "<i8", "offsets": "<i8", "ids": "<i4", "tfs": "<i4"}


def array_digest(arrays: Mapping[str, bytes]) -> str:
    """Of every array: the structural checks cannot see a posting moved to a neighbouring term."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        digest.update(name.encode() + b"\0" + len(arrays[name]).to_bytes(8, "little"))
        digest.update(arrays[name])
    return digest.hexdigest()


class SnapshotError(Exception):
    """A snapshot that cannot be used (missing, damaged, or built for something else); the message says which."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """A memory file as the snapshot indexed it: its root's number, path, signature and first document id."""

    root: int
    rel: str
    signature: Signature
    first_doc: int


@functools.cache
def _code_digest() -> str:
    """Of the modules that decide chunks, tokens and postings: a changed tokenizer must not meet an old index."""
    digest = hashlib.sha256()
    for module in (chunker, tokenize, bm25, frozen_module):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()[:16]


def identity(roots: Mapping[str, Path], max_chunk_chars: int) -> dict[str, str]:
    """What a snapshot must have been built for to be used: this format and code, these roots, this chunk size."""
    return {
        "format": str(FORMAT_VERSION),
        "farmhost": __version__,
        "code": _code_digest(),
        "roots": json.dumps([[label, str(path)] for label, path in roots.items()]),
        "max_chunk_chars": str(max_chunk_chars),
    }


def temp_path(path: Path, pid: int) -> Path:
    """Where process `pid` writes the snapshot of `path` before renaming it into place."""
    return path.with_name(f".{path.name}.{pid}.tmp")


def write_snapshot(
    path: Path,
    ident: Mapping[str, str],
    files: Sequence[tuple[int, str, Signature, Sequence[Chunk]]],
    frozen: FrozenIndex,
) -> None:
    """Write a snapshot whole, then rename it over `path` (mode 0600).

    Args:
        path: Where it goes (its directory exists).
        ident: `identity(...)` of the corpus.
        files: (root number, path, signature, chunks) per segment of `frozen`, in the same (key) order.
        frozen: The index of those chunks.
    """
    if [("memory", root, rel) for root, rel, _, _ in files] != frozen.keys:
        raise ValueError("the files are not the frozen index's segments")
    if any("\n" in term for term in frozen.terms):
        raise ValueError("a term holds a newline")
    tmp = temp_path(path, os.getpid())
    tmp.unlink(missing_ok=True)
    try:
        with closing(sqlite3.connect(tmp)) as db:
            os.chmod(tmp, 0o600)
            db.executescript(_SCHEMA)
            db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(ident.items()))
            file_rows, chunk_rows, doc = [], [], 0
            for seg, (root, rel, sig, chunks) in enumerate(files):
                file_rows.append((seg, root, rel, *sig, len(chunks)))
                for chunk in chunks:
                    chunk_rows.append((doc, chunk.start_line, chunk.end_line, chunk.heading, chunk.text))
                    doc += 1
            db.executemany("INSERT INTO file VALUES (?, ?, ?, ?, ?, ?, ?, ?)", file_rows)
            db.executemany("INSERT INTO chunk VALUES (?, ?, ?, ?, ?)", chunk_rows)
            arrays = {name: getattr(frozen, name).astype(dtype).tobytes() for name, dtype in _ARRAYS.items()}
            arrays["terms"] = "\n".join(frozen.terms).encode()
            db.executemany("INSERT INTO array VALUES (?, ?)", sorted(arrays.items()))
            db.execute("INSERT INTO meta VALUES ('digest', ?)", (array_digest(arrays),))
            db.commit()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Snapshot:
    """An opened, checked snapshot: its frozen index, its files, and its chunks read on demand."""

    def __init__(self, db: sqlite3.Connection, files: list[SnapshotFile], frozen: FrozenIndex) -> None:
        self._db = db
        self.files = files
        self.frozen = frozen

    def chunk(self, doc: int, path: str) -> Chunk:
        """The chunk of document `doc`, which belongs to the file `path`."""
        row = self._db.execute("SELECT start_line, end_line, heading, text FROM chunk WHERE doc = ?", (doc,)).fetchone()
        if row is None:
            raise SnapshotError(f"chunk {doc} is missing")
        return Chunk(path, row[0], row[1], row[3], row[2])

    def close(self) -> None:
        """Close the file."""
        self._db.close()


def open_snapshot(path: Path, ident: Mapping[str, str], roots: int) -> Snapshot:
    """Open and check a snapshot built for `ident` over `roots` roots.

    Raises:
        SnapshotError: it is missing, unreadable, or built for something else, or its content is inconsistent.
    """
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)  # used by one search thread at a time
    except sqlite3.Error as exc:
        raise SnapshotError(f"cannot open it: {exc}") from exc
    try:
        return Snapshot(db, *_read(db, ident, roots))
    except (sqlite3.Error, ValueError, UnicodeDecodeError, TypeError) as exc:
        db.close()
        raise SnapshotError(str(exc)) from exc
    except SnapshotError:
        db.close()
        raise


def _read(db: sqlite3.Connection, ident: Mapping[str, str], roots: int) -> tuple[list[SnapshotFile], FrozenIndex]:
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    for key, want in ident.items():
        if meta.get(key) != want:
            raise SnapshotError(f"built for {key} {meta.get(key)!r}, not {want!r}")
    rows = db.execute("SELECT seg, root, rel, ino, size, mtime_ns, ctime_ns, chunks FROM file ORDER BY seg").fetchall()
    if [row[0] for row in rows] != list(range(len(rows))):
        raise SnapshotError("file rows are not numbered from 0")
    blobs = dict(db.execute("SELECT name, data FROM array").fetchall())
    if set(blobs) != {*_ARRAYS, "terms"} or not all(isinstance(b, bytes) for b in blobs.values()):
        raise SnapshotError(f"arrays {sorted(blobs)} are not the expected ones")
    arrays = {}
    for name, dtype in _ARRAYS.items():
        if len(blobs[name]) % np.dtype(dtype).itemsize:
            raise SnapshotError(f"array {name} is cut short")
        arrays[name] = np.frombuffer(blobs[name], dtype=dtype)
    if meta.get("digest") != array_digest(blobs):
        raise SnapshotError("the arrays do not match their digest")
    terms = blobs["terms"].decode().split("\n") if blobs["terms"] else []
    keys = [("memory", int(row[1]), str(row[2])) for row in rows]
    if any(not 0 <= root < roots for _, root, _ in keys):
        raise SnapshotError("a file belongs to a root the corpus does not have")
    if not np.array_equal(arrays["counts"], np.array([row[7] for row in rows], dtype=np.int64)):
        raise SnapshotError("file chunk counts disagree with the index")
    frozen = FrozenIndex(
        keys, arrays["counts"], arrays["doc_len"], terms, arrays["offsets"], arrays["ids"], arrays["tfs"]
    )
    frozen.check()
    count, low, high = db.execute("SELECT count(*), min(doc), max(doc) FROM chunk").fetchone()
    if count != frozen.n_docs or (count and (low != 0 or high != count - 1)):
        raise SnapshotError(f"{count} chunk rows for {frozen.n_docs} documents")
    files = [
        SnapshotFile(int(root), str(rel), (int(ino), int(size), int(mt), int(ct)), int(start))
        for (_, root, rel, ino, size, mt, ct, _), start in zip(rows, frozen.starts.tolist(), strict=True)
    ]
    return files, frozen
