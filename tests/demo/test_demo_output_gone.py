"""`make demo | tee log`, then Ctrl-C: the demo stops within 10 s even though nobody reads its output any more.

Ctrl-C in a terminal reaches the whole pipeline, so `tee` is gone first and the demo's stdout is a pipe with no
reader: every line it prints from then on fails with EPIPE. The signal must still stop it (HA included), for
SIGINT and SIGTERM alike, with exit status 0 and no traceback. Each case is a real demo process (cached HA,
`--no-chat --no-screenshot`) whose stdout pipe the test closes once the demo has printed its summary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from demo_support import alive, ha_pids, kill_ha, require_cached_ha
from farmhost_testing import clean_env, scaled, wait_for

from farmhost.demo.output import LineOutput

STOP_WITHIN_S = 10.0  # issue 15: the demo stops within 10 s of the signal


@pytest.mark.slow  # a Home Assistant start per case
@pytest.mark.timeout(150)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_demo_stops_on_a_signal_when_its_output_is_gone(tmp_path: Path, sig: signal.Signals) -> None:
    require_cached_ha()
    data_dir = tmp_path / "demo-data"
    stderr_path = tmp_path / "stderr.log"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "farmhost", "demo", "--data-dir", str(data_dir), "--port", "0", "--tick", "1"]
            + ["--no-chat", "--no-screenshot"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=clean_env(FARMHOST_AGENT_RUNTIME="process"),
            cwd=tmp_path,
        )
    try:
        assert proc.stdout is not None
        lines: list[bytes] = []

        def read_to_summary() -> None:  # what `tee` shows until Ctrl-C
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(b"Stop: Ctrl-C"):
                    return

        reader = threading.Thread(target=read_to_summary, daemon=True)
        reader.start()
        wait_for(
            lambda: not reader.is_alive(),
            timeout=60,
            what="the demo's summary (its `Stop: Ctrl-C` line) on stdout",
            seen=lambda: b"".join(lines).decode(errors="replace") + stderr_path.read_text(errors="replace"),
        )
        assert proc.poll() is None, b"".join(lines).decode(errors="replace")
        running_ha = ha_pids(data_dir)
        assert running_ha and all(alive(pid) for pid in running_ha)

        proc.stdout.close()  # the reader is gone: from now on each line the demo prints meets EPIPE
        started = time.monotonic()
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=scaled(STOP_WITHIN_S))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the demo did not stop within {scaled(STOP_WITHIN_S):.1f} s of {sig.name} with its stdout gone; "
                f"stderr:\n{stderr_path.read_text(errors='replace')[-3000:]}"
            ) from None
        took = time.monotonic() - started
        errors = stderr_path.read_text(errors="replace")
        assert code == 0, f"exit status {code} after {sig.name}; stderr:\n{errors}"
        assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
        assert not any(alive(pid) for pid in running_ha), "the demo's Home Assistant outlived it"
        print(f"\n{sig.name} with stdout gone: stopped in {took:.1f} s", file=sys.stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None and not proc.stdout.closed:
            proc.stdout.close()
        kill_ha(data_dir)


def test_the_demo_output_drops_lines_once_its_reader_is_gone(tmp_path: Path) -> None:
    """The writer itself, on a real pipe: the first EPIPE marks it gone, later lines (any thread) go nowhere."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", encoding="utf-8")
    try:
        output = LineOutput(stream)
        output("[demo] first")
        assert os.read(read_end, 100) == b"[demo] first\n" and not output.gone
        os.close(read_end)
        output("[demo] SIGINT: stopping")  # EPIPE: no exception, the output is gone
        assert output.gone
        writers = [threading.Thread(target=output, args=(f"[sim] line {n}",)) for n in range(4)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        # The descriptor now leads to /dev/null: the interpreter's last flush at exit meets no broken pipe.
        assert os.path.samestat(os.fstat(stream.fileno()), os.stat(os.devnull))
        stream.write("still buffered\n")
        stream.flush()
    finally:
        stream.close()


def test_the_demo_chat_prints_the_agents_words_not_its_escape_sequences() -> None:
    """The terminal chat shows what the agent sent; an escape sequence in it is written out, lines are kept."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w", encoding="utf-8") as stream:
        LineOutput(stream)("agent: frost\x1b]52;c;cm0gLXJmIH4=\x07 tonight\x9b2J\n\u202eline two")
    with os.fdopen(read_end, "rb") as reader:
        printed = reader.read().decode()
    assert printed == "agent: frost\\x1b]52;c;cm0gLXJmIH4=\\x07 tonight\\x9b2J\n\\u202eline two\n"
