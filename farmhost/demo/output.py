"""Where the demo's lines go: stdout, one flushed line at a time, until nobody reads it any more.

`make demo | tee log` and then Ctrl-C: the terminal sends SIGINT to the whole pipeline, `tee` is gone first, and
every line the demo prints after that fails with EPIPE (BrokenPipeError) — in the signal handler, in the
simulator's thread, in the teardown. The demo must still stop, so its output never raises: the first failed
write marks the output gone, later lines are dropped, and the descriptor is pointed at /dev/null so that nothing
else (the interpreter's last flush at exit, a stray print) meets the broken pipe again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TextIO

from farmhost.terminal import for_terminal


class LineOutput:
    """A writer of whole lines that survives its reader going away; callable from any thread."""

    def __init__(self, stream: TextIO | None = None) -> None:
        """Write to `stream` (default: `sys.stdout` at the time of each line)."""
        self._stream = stream
        self._lock = threading.Lock()
        self.gone = False  # the reader went away; lines are dropped since

    def __call__(self, line: str) -> None:
        """Write `line` and a newline, flushed; nothing (and no exception) once the output is gone.

        The chat's lines are the agent's words: what a terminal would act on in them is written out, not sent.
        """
        with self._lock:
            if self.gone:
                return
            stream = self._stream or sys.stdout
            try:
                stream.write(for_terminal(line, keep_lines=True) + "\n")
                stream.flush()
            except (BrokenPipeError, ConnectionResetError, ValueError):  # ValueError: the stream was closed
                self.gone = True
                _discard(stream)


def _discard(stream: TextIO) -> None:
    """Point `stream`'s descriptor at /dev/null: what is still buffered, and anything written later, goes there."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
