"""Paths and numbers the operator got wrong: one line saying what is wrong and what to do, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from farmhost_testing import farmhost


def _one_line(done: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for phrase in phrases:
        assert phrase in lines[0], f"{phrase!r} not in {lines[0]!r}"
    return lines[0]


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    plain = tmp_path / "afile"
    plain.write_text("not a directory\n")
    for command in [("init",), ("group", "add", "--jid", "telegram:9", "--name", "x", "--folder", "x")]:
        done = farmhost(*command, data_dir=plain)
        _one_line(done, "farmhost: error:", str(plain), "not a directory")
    assert plain.read_text() == "not a directory\n", "left as it was"


def test_schema_written_where_it_cannot_go(tmp_path: Path) -> None:
    data = tmp_path / "data"
    missing = tmp_path / "absent" / "x.json"
    _one_line(farmhost("schema", "-o", str(missing), data_dir=data), str(missing), "does not exist")
    _one_line(farmhost("schema", "-o", str(tmp_path), data_dir=data), str(tmp_path), "is a directory")
    assert not missing.parent.exists()
    written = farmhost("schema", "-o", str(tmp_path / "ok.json"), data_dir=data)
    assert written.returncode == 0 and (tmp_path / "ok.json").read_text().startswith("{"), written.stderr


@pytest.mark.parametrize("timeout", ["nan", "-5", "0", "inf", "soon"])
def test_ipc_send_refuses_a_timeout_that_is_not_a_positive_number(data_dir: Path, timeout: str) -> None:
    args = ("ipc", "send", "--group=main", "--queue=actions", '--json={"type":"ping"}', f"--timeout={timeout}")
    done = farmhost(*args, data_dir=data_dir)
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr, done.stderr
    error = done.stderr.strip().splitlines()[-1]  # after argparse's usage line, as for every bad option
    assert "--timeout" in error and "positive number of seconds" in error and repr(timeout) in error, error
    assert list((data_dir / "ipc" / "main" / "actions").iterdir()) == [], "nothing written"
