"""What the round-trip benchmarks share on the command line: progress lines, `--json`/`--dir`, and the output."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


def log(message: str) -> None:
    """Progress on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """`--json [PATH]` and `--dir DIR` (where the temporary data dirs go)."""
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="also write the figures as JSON to PATH ('-' or no value: stdout; the table then "
                             "goes to stderr)")  # fmt: skip
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where to create the temporary data dirs (default: the system temp dir)")  # fmt: skip


def emit(table: str, document: dict[str, Any], json_to: str | None) -> None:
    """Print the table; with `json_to`, the document as JSON too (to stdout for '-', the table then to stderr)."""
    print(table, file=sys.stderr if json_to == "-" else sys.stdout, flush=True)
    if json_to:
        text = json.dumps(document, indent=2, default=str)
        if json_to == "-":
            print(text)
        else:
            Path(json_to).write_text(text + "\n", encoding="utf-8")


def report_run(name: str, measure: Callable[[], R], render: Callable[[R], str], json_to: str | None) -> int:
    """Measure, then `emit` the rendered report: 0 whatever the figures, 2 when the benchmark could not run."""
    try:
        report = measure()
    except (RuntimeError, OSError) as err:
        print(f"{name}: could not run the benchmark: {err}", file=sys.stderr)
        return 2
    emit(render(report), asdict(report), json_to)
    return 0


def machine_lines(date: str, machine: dict[str, Any], wall_seconds: float) -> list[str]:
    """The machine, the farmhost build, the disk and the load of a run (`machine_info` with the `at_end` figures)."""
    m = machine
    return [
        (
            f"{date}  {m['nproc']} x {m['cpu']}, kernel {m['kernel']}, Python {m['python']}, "
            f"farmhost {m['farmhost_commit']}, {wall_seconds:g} s"
        ),
        (
            f"data dirs on {m['filesystem']}: file create p50 {m['create_p50_us']} -> {m['at_end']['create_p50_us']} us, "
            f"fsync p50 {m['fsync_p50_us']} -> {m['at_end']['fsync_p50_us']} us, load average "
            f"{m['loadavg_at_start']:.2f} -> {m['loadavg_at_end']:.2f} (start -> end)"
        ),
    ]


def busy_note(machine: dict[str, Any]) -> list[str]:
    """A warning line when the machine was busy at the start of the run (nothing otherwise)."""
    load = machine["loadavg_at_start"]
    return [f"note: the machine was busy at start (load average {load:.2f}); figures are noisy"] if load > 0.5 else []
