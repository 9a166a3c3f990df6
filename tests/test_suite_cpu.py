"""farmhost_dev.suite_cpu reads the kernel's accounting records and names each process's kind by its command line."""

from __future__ import annotations

from farmhost_dev.suite_cpu import RECORD, report


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
