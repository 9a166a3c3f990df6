"""Running the memory builder process (`python -m farmhost.memory.indexer`): a first index built off the daemon's GIL.

A group's first index over thousands of chunks is seconds of pure-Python work; in a thread of the daemon it
holds the GIL so long that every other group's requests wait (pings p99 150 ms during a 10,000-chunk build).
In a process of its own it only competes for a CPU. The child reports its progress as JSON lines on stdout;
it is killed when it takes longer than the timeout, and its last lines of output explain a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

# Generous: 10,000 chunks take about 1.5 s here and several times that on a Raspberry Pi.
BUILD_TIMEOUT_SECONDS: Final = 600.0
MODULE: Final = "farmhost.memory.indexer"


class BuildError(Exception):
    """The builder failed, or took too long; the message says how."""


def run_builder(
    roots: Mapping[str, Path],
    out: Path,
    *,
    max_chunk_chars: int,
    name: str,
    timeout: float = BUILD_TIMEOUT_SECONDS,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Build the snapshot of `roots` at `out` in a child process, waiting for it (call from a worker thread).

    Args:
        roots: Label -> workspace directory, in search order (as the corpus has them).
        out: The snapshot file written (renamed into place by the child).
        max_chunk_chars: The chunker's size cap.
        name: The group, for the child's command line and errors.
        timeout: Seconds before the child is killed.
        on_progress: Called with the number of files read so far, now and then.

    Returns:
        (files indexed, chunks indexed).

    Raises:
        BuildError: the child could not start, failed, or was killed at the timeout.
    """
    command = [sys.executable, "-m", MODULE, "--out", str(out), "--max-chunk-chars", str(max_chunk_chars)]
    command += ["--name", name]
    for label, path in roots.items():
        command += ["--root", f"{label}={path}"]
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as exc:
        raise BuildError(f"cannot start {MODULE}: {exc}") from exc
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        child.kill()

    killer = threading.Timer(timeout, kill)
    killer.daemon = True
    killer.start()
    other: deque[str] = deque(maxlen=12)
    summary: tuple[int, int] | None = None
    assert child.stdout is not None
    try:
        for line in child.stdout:
            message = _message(line)
            if message is not None and "done" in message and on_progress is not None:
                on_progress(int(message["done"]))
            elif message is not None and "chunks" in message:
                summary = int(message["files"]), int(message["chunks"])
            elif message is None and line.strip():
                other.append(line.rstrip()[:300])
        code = child.wait()
    finally:
        killer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    if timed_out.is_set():
        raise BuildError(f"the memory builder of {name} took longer than {timeout:g} s and was stopped")
    if code != 0 or summary is None:
        raise BuildError(f"the memory builder of {name} exited with {code}: {' | '.join(other) or 'no output'}")
    return summary


def _message(line: str) -> dict[str, int] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or not all(isinstance(v, int) for v in message.values()):
        return None
    return message
