"""`python -m farmhost.memory.indexer`: read, chunk and index a group's memory, and write it as a snapshot.

The daemon runs this (`indexer_process.run_builder`) for a first index too big to build beside its event loop, and
loads the snapshot it writes (`snapshot.py`). It runs with the daemon's interpreter and code, as the daemon's
user, reading the workspaces the same symlink-safe way (it is the same `MemoryCorpus`). Output, on stdout:
`{"done": <files read>}` now and then, `{"files": <n>, "chunks": <n>}` at the end; anything else is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from farmhost.memory.chunker import DEFAULT_MAX_CHARS
from farmhost.memory.corpus import MemoryCorpus

PROGRESS_EVERY_SECONDS: Final = 0.25
NICENESS: Final = 10  # behind the daemon and the agents it serves


def _root(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {text!r}")
    return label, Path(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m farmhost.memory.indexer",
        description="Build the memory search index of a group's workspaces and write it as a snapshot file. "
        "The daemon runs this itself for a group's first search over a large memory; run it by hand only to "
        "check that a workspace can be indexed.",
    )
    parser.add_argument("--out", type=Path, required=True, help="the snapshot file to write")
    parser.add_argument("--root", type=_root, action="append", required=True, metavar="LABEL=PATH",
                        help="a workspace root, in search order (repeat)")  # fmt: skip
    parser.add_argument("--max-chunk-chars", type=int, default=DEFAULT_MAX_CHARS, help="the chunk size cap")
    parser.add_argument("--name", default=None, help="the group, for messages")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Build and write the snapshot; 0 when written."""
    args = _parser().parse_args(argv)
    with contextlib.suppress(OSError):  # not allowed: run at the daemon's priority
        os.nice(NICENESS)
    roots = dict(args.root)
    corpus = MemoryCorpus(roots, max_chunk_chars=args.max_chunk_chars, name=args.name, inotify=False)
    last = 0.0

    def report(done: int) -> None:
        nonlocal last
        if (now := time.monotonic()) - last >= PROGRESS_EVERY_SECONDS:
            last = now
            print(json.dumps({"done": done}), flush=True)

    try:
        files, chunks = corpus.refresh(on_file=report)
        corpus.save_snapshot(args.out)
    except (OSError, sqlite3.Error) as exc:
        print(f"cannot write the memory index {args.out}: {exc}", file=sys.stderr)
        return 1
    finally:
        corpus.close()
    print(json.dumps({"files": files, "chunks": chunks}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
