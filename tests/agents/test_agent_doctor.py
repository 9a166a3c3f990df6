"""`farmhost doctor` on the agent runtime: the sandbox really works, and the limits file is valid."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from farmhost_testing import clean_env, farmhost, init_data_dir_in_process

from farmhost.agents.cgroups import detect_sync


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return init_data_dir_in_process(tmp_path / "data")


def checks(data_dir: Path, **env: str) -> dict[str, dict[str, str]]:
    done = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(**env))
    assert "Traceback" not in done.stderr, done.stderr
    return {c["part"]: c for c in json.loads(done.stdout)}


def test_bwrap_is_checked_for_real(data_dir: Path, tmp_path: Path) -> None:
    sandbox = checks(data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable)["sandbox"]
    assert (
        sandbox["state"] == "ok"
        and sandbox["detail"] == f"bwrap ({shutil.which('bwrap')}), agent interpreter {sys.executable}"
    )
    missing = tmp_path / "python3"
    sandbox = checks(data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=str(missing))["sandbox"]
    assert sandbox["state"] == "broken" and f"cannot run the agent interpreter {missing}" in sandbox["detail"]
    assert "FARMHOST_AGENT_PYTHON" in sandbox["fix"]


def test_the_process_runtime_is_a_warning(data_dir: Path) -> None:
    sandbox = checks(data_dir, FARMHOST_AGENT_RUNTIME="process")["sandbox"]
    assert "NO isolation (development only)" in sandbox["detail"] and sandbox["fix"] == "use bwrap or docker"


def test_the_limits_file_is_validated(data_dir: Path) -> None:
    limits = checks(data_dir, FARMHOST_AGENT_RUNTIME="process")["agent limits"]
    assert limits == {
        "part": "agent limits",
        "state": "ok",
        "detail": "every group: 600 s, 1024 MB, 256 processes, 12 turns (no agent-limits.json)",
        "fix": "",
    }
    path = data_dir / "agent-limits.json"
    path.write_text(json.dumps({"groups": {"field": {"pids": 4}}}))
    limits = checks(data_dir, FARMHOST_AGENT_RUNTIME="process")["agent limits"]
    assert limits["state"] == "broken"
    assert limits["detail"] == f"{path}: groups.field.pids: Input should be greater than or equal to 8 (got 4)"
    path.write_text(json.dumps({"default": {"timeoutSeconds": 120}, "groups": {"field": {"pids": 32}}}))
    limits = checks(data_dir, FARMHOST_AGENT_RUNTIME="process")["agent limits"]
    assert limits["state"] == "ok" and "1 group override(s)" in limits["detail"]


def test_the_doctor_says_which_limits_hold_under_bwrap(data_dir: Path) -> None:
    limits = checks(data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable)["agent limits"]
    found = re.search(r"runs as uid (\d+) \(", limits["detail"])
    assert found is not None, limits
    uid = int(found[1])
    assert uid != 0 if os.geteuid() == 0 else uid == os.geteuid(), "a root daemon's runs are never uid 0"
    assert "held: wall time, memory per process, /tmp and /dev/shm sizes, workspace size" in limits["detail"]
    support = detect_sync()  # what this host offers, found the way the daemon finds it
    if support.available:
        assert limits["state"] == "ok", limits
        assert f"processes and CPU share per run (cgroup v{support.version})" in limits["detail"]
    else:
        assert limits["state"] == "broken" and "agent runs are refused: no cgroup" in limits["detail"], limits
        assert support.reason in limits["detail"] and "FARMHOST_AGENT_UNENFORCED_LIMITS=allow" in limits["fix"]
