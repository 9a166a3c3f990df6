"""farmhost_dev.suite_cpu reads the kernel's accounting records and names each process's kind by its command line."""

from __future__ import annotations

import json
from pathlib import Path

from farmhost_dev.suite_cpu import RECORD, processes, report, write_each


def _record(pid: int, program: bytes, utime: int, stime: int) -> bytes:
    # ac_flag, ac_version 3, tty, exitcode, uid, gid, pid, ppid, btime, etime, utime, stime, mem, io, rw, minflt,
    # majflt, swaps, comm
    return RECORD.pack(0, 3, 0, 0, 0, 0, pid, 1, 0, 0.0, utime, stime, 0, 0, 0, 0, 0, 0, program)


def test_records_are_summed_by_kind_with_the_command_line_first_and_the_program_name_as_fallback() -> None:
    big = (1 << 13) | 25  # comp_t: mantissa 25, exponent 1 (x8) = 200 ticks
    records = b"".join(
        [
            _record(10, b"python", 150, 50),  # 2.0 s, named by its command line
            _record(11, b"python", big, 0),  # 2.0 s
            _record(12, b"chrome", 100, 0),  # 1.0 s, no command line seen: its program's name
            _record(13, b"sed", 10, 0),
        ]
    )
    commands = {10: "python -m homeassistant -c /x", 11: "python farmhost_dev/forkserver.py 14"}
    rows = report(records, commands)
    assert rows == [
        ("Home Assistant", 2.0, 1),
        ("fork server children (daemons, CLI calls)", 2.0, 1),
        ("Chromium", 1.0, 1),
        ("other: sed", 0.1, 1),
    ]


def test_a_hass_forked_from_its_supervisor_counts_as_home_assistant() -> None:
    """A forked hass keeps its supervisor's command line (farmhost/localha/supervisor.py)."""
    command = "/ha/venv/bin/python /x/farmhost/localha/supervisor.py --python /ha/venv/bin/python --config /c"
    ((kind, cpu, pid, named),) = processes(_record(20, b"python3", 300, 0), {20: command})
    assert (kind, cpu, pid, named) == ("Home Assistant", 3.0, 20, command)


def test_each_process_is_written_as_a_json_line(tmp_path: Path) -> None:
    """`--each FILE`: every process that ended, with its kind, CPU, pid and command line (or program name)."""
    each = tmp_path / "each.jsonl"
    records = _record(30, b"python", 40, 10) + _record(31, b"sed", 5, 0)
    write_each(each, records, {30: "python -m farmhost run"})
    rows = [json.loads(line) for line in each.read_text().splitlines()]
    assert rows == [
        {"kind": "farmhost started by exec", "cpu": 0.5, "pid": 30, "command": "python -m farmhost run"},
        {"kind": "other: sed", "cpu": 0.05, "pid": 31, "command": "sed"},
    ]
