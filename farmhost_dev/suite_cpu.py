"""Where a command's CPU goes, by kind of process: run it under the kernel's process accounting.

    sudo .venv/bin/python -m farmhost_dev.suite_cpu -- .venv/bin/pytest -q -n 4 --dist loadfile ...

The test suite's CPU is spent in processes pytest never waits for (the fork server's children, Home Assistant,
containers, the speech-to-text worker), so `/usr/bin/time` misses most of it. BSD process accounting (`acct(2)`,
root only) writes a record for every process that ends, anywhere on the machine, with its CPU time; a thread
reads `/proc` every 50 ms meanwhile to name each process by its command line (a record holds only 16 characters
of the program's name). At the end it prints the CPU seconds of each kind, most first (docs/testing.md).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# struct acct_v3 (linux/acct.h): 64 bytes; comp_t times in AHZ (100) ticks, 3-bit base-8 exponent, 13-bit mantissa.
RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")
AHZ = 100
# The first part of a command line that names its kind (first match wins), then the program's name in the record.
KINDS = (
    ("homeassistant", "Home Assistant"),
    ("localha/supervisor.py", "Home Assistant"),  # the supervisor, and each hass it forks
    ("exec(eval(sys.stdin", "pytest-xdist workers (the tests in process)"),
    ("forkserver.py", "fork server children (daemons, CLI calls)"),
    ("local_llm", "llama.cpp server"),
    ("voice.worker", "speech-to-text worker"),
    ("wyoming", "Wyoming server"),
    ("opencode", "OpenCode"),
    ("chrom", "Chromium"),
    ("headless_shell", "Chromium"),
    ("docker", "Docker engine and containers"),
    ("containerd", "Docker engine and containers"),
    ("farmagent", "sandboxed agents (farmagent)"),
    ("farmhost.memory.indexer", "memory index builders"),
    ("-m farmhost", "farmhost started by exec"),
    ("bin/farmhost", "farmhost started by exec"),
    ("pytest", "pytest (main)"),
    ("uv", "uv (builds, installs)"),
)


def _comp(value: int) -> float:
    return ((value & 0x1FFF) << (3 * (value >> 13))) / AHZ


def _kind(command: str, program: str) -> str:
    for part, kind in KINDS:
        if part in command:
            return kind
    for part, kind in KINDS:
        if part in program:
            return kind
    return f"other: {program}"


class Namer(threading.Thread):
    """Remembers each process's command line as first seen (after its exec, if it was seen before it)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.commands: dict[int, str] = {}
        self.done = threading.Event()

    def run(self) -> None:
        """Scan /proc until told to stop."""
        while not self.done.wait(0.05):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    raw = Path(entry.path, "cmdline").read_bytes()
                except OSError:
                    continue
                command = raw.replace(b"\0", b" ").decode(errors="replace")
                if command and self.commands.get(int(entry.name)) != command:
                    self.commands[int(entry.name)] = command


def processes(records: bytes, commands: dict[int, str]) -> Iterator[tuple[str, float, int, str]]:
    """(kind, CPU seconds, pid, command line) of each process that ended."""
    for offset in range(0, len(records) - RECORD.size + 1, RECORD.size):
        fields = RECORD.unpack_from(records, offset)
        pid, utime, stime, program = fields[6], fields[10], fields[11], fields[18]
        name = program.split(b"\0")[0].decode(errors="replace")
        command = commands.get(pid, "")
        yield _kind(command, name), _comp(utime) + _comp(stime), pid, command or name


def report(records: bytes, commands: dict[int, str]) -> list[tuple[str, float, int]]:
    """(kind, CPU seconds, processes), most CPU first."""
    seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    for kind, cpu, _, _ in processes(records, commands):
        seconds[kind] += cpu
        count[kind] += 1
    return sorted(((kind, cpu, count[kind]) for kind, cpu in seconds.items()), key=lambda row: -row[1])


def write_each(path: Path, records: bytes, commands: dict[int, str]) -> None:
    """Every process that ended, one JSON object a line: kind, CPU seconds, pid, command line."""
    with path.open("w") as out:
        for kind, cpu, pid, command in processes(records, commands):
            out.write(json.dumps({"kind": kind, "cpu": cpu, "pid": pid, "command": command}) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the command under accounting; print the table; its exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--each", type=Path, help="also write every process (kind, CPU, pid, command) here as JSON lines"
    )
    parser.add_argument("command", nargs="+", help="the command to run and measure (after --)")
    args = parser.parse_args(argv)
    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch, "pacct")
        path.touch()
        if libc.acct(str(path).encode()) != 0:
            print(
                f"cannot turn process accounting on: {os.strerror(ctypes.get_errno())} (run as root)", file=sys.stderr
            )
            return 2
        namer = Namer()
        namer.start()
        started = time.monotonic()
        try:
            code = subprocess.call(args.command)
        finally:
            libc.acct(None)
            namer.done.set()
            namer.join()
        wall = time.monotonic() - started
        records = path.read_bytes()
        rows = report(records, namer.commands)
        if args.each is not None:
            write_each(args.each, records, namer.commands)
    total = sum(cpu for _, cpu, _ in rows)
    print(f"\n{total:.1f} CPU-seconds in {wall:.1f} s ({total / wall:.2f} cores busy on average), exit code {code}")
    for kind, cpu, count in rows[:20]:
        print(f"{cpu:8.1f} s {100 * cpu / total:5.1f} %  {count:6d} processes  {kind}")
    return code


if __name__ == "__main__":
    sys.exit(main())
