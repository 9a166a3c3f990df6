"""Running the memory builder process (`python -m farmhost.memory.indexer`): a first index built off the daemon's GIL.

A group's first index over thousands of chunks is seconds of pure-Python work; in a thread of the daemon it
holds the GIL so long that every other group's requests wait (pings p99 150 ms during a 10,000-chunk build).
In a process of its own it only competes for a CPU. The child reports its progress as JSON lines on stdout;
it is killed when it takes longer than the timeout, or at once when the daemon stops (`BuildStop`), and its last
lines of output explain a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

from farmhost.memory.snapshot import temp_path

# Generous: 10,000 chunks take about 1.5 s here and several times that on a Raspberry Pi.
BUILD_TIMEOUT_SECONDS: Final = 600.0
MODULE: Final = "farmhost.memory.indexer"


class BuildError(Exception):
    """The builder failed, or took too long; the message says how."""


class BuildStopped(Exception):
    """The daemon is stopping: the index was not built, and must not be built in its stead either."""


class BuildStop:
    """Ends every builder child at once when the daemon stops, from any thread, so the threads waiting for them return.

    The daemon's stop has 10 s (SPEC section 7) while a builder may take minutes; waiting for it would hold the
    process past that bound, since the thread waiting for the child cannot be cancelled.
    """

    def __init__(self) -> None:
        """Not requested yet."""
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen[str]] = set()
        self._requested = False

    @property
    def requested(self) -> bool:
        """Whether the stop was asked for: an index being read in a thread gives up too."""
        return self._requested

    def stop(self) -> None:
        """Kill the running builders, and any started after this."""
        with self._lock:
            self._requested = True
            children = list(self._children)
        for child in children:
            child.kill()

    def track(self, child: subprocess.Popen[str]) -> None:
        """Follow a child until `forget`; killed at once when the stop was already asked for."""
        with self._lock:
            self._children.add(child)
            if not self._requested:
                return
        child.kill()

    def forget(self, child: subprocess.Popen[str]) -> None:
        """The child is done."""
        with self._lock:
            self._children.discard(child)


def run_builder(
    roots: Mapping[str, Path],
    out: Path,
    *,
    max_chunk_chars: int,
    name: str,
    timeout: float = BUILD_TIMEOUT_SECONDS,
    on_progress: Callable[[int], None] | None = None,
    stop: BuildStop | None = None,
) -> tuple[int, int]:
    """Build the snapshot of `roots` at `out` in a child process, waiting for it (call from a worker thread).

    Args:
        roots: Label -> workspace directory, in search order (as the corpus has them).
        out: The snapshot file written (renamed into place by the child).
        max_chunk_chars: The chunker's size cap.
        name: The group, for the child's command line and errors.
        timeout: Seconds before the child is killed.
        on_progress: Called with the number of files read so far, now and then.
        stop: Kills the child when the daemon stops.

    Returns:
        (files indexed, chunks indexed).

    Raises:
        BuildError: the child could not start, failed, or was killed at the timeout.
        BuildStopped: `stop` killed the child.
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
    if stop is not None:
        stop.track(child)
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        child.kill()

    killer = threading.Timer(timeout, kill)
    killer.daemon = True
    killer.start()
    assert child.stdout is not None
    try:
        summary, other = _read_output(child.stdout, on_progress)
        code = child.wait()
    finally:
        killer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if stop is not None:
            stop.forget(child)
    if code != 0:  # a killed child leaves its unfinished snapshot behind
        temp_path(out, child.pid).unlink(missing_ok=True)
    if stop is not None and stop.requested:
        raise BuildStopped(f"the memory builder of {name} was stopped with the daemon")
    if timed_out.is_set():
        raise BuildError(f"the memory builder of {name} took longer than {timeout:g} s and was stopped")
    if code != 0 or summary is None:
        raise BuildError(f"the memory builder of {name} exited with {code}: {' | '.join(other) or 'no output'}")
    return summary


def _read_output(
    lines: Iterable[str], on_progress: Callable[[int], None] | None
) -> tuple[tuple[int, int] | None, deque[str]]:
    """The child's summary (None: it ended without one) and its last other lines, reporting progress meanwhile."""
    other: deque[str] = deque(maxlen=12)
    summary: tuple[int, int] | None = None
    for line in lines:
        message = _message(line)
        if message is not None and "done" in message and on_progress is not None:
            on_progress(int(message["done"]))
        elif message is not None and "chunks" in message:
            summary = int(message["files"]), int(message["chunks"])
        elif message is None and line.strip():
            other.append(line.rstrip()[:300])
    return summary, other


def _message(line: str) -> dict[str, int] | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or not all(isinstance(v, int) for v in message.values()):
        return None
    return message
