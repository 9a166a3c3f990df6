"""`farmhost doctor` on the agent runtime: the sandbox and its seccomp filter really work, the limits file is valid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from farmhost_testing import Daemon, clean_env, farmhost, init_data_dir_in_process, scaled, wait_for
from runtime_support import SYSTEM_PYTHON, as_another_user, settings_for

from farmhost.agents.sandbox.backends import SandboxError, create_backend
from farmhost.agents.sandbox.cgroups import detect_sync
from farmhost.agents.sandbox.seccomp import build_filter_sync
from farmhost.cli.doctor import SECCOMP_TRIAL
from farmhost.config import AGENT_UID_BASE, build_config


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
    if os.geteuid() == 0:  # a root daemon's runs are never uid 0, nor one uid for all groups
        assert (
            f"agents run as per-group uids {AGENT_UID_BASE}..{AGENT_UID_BASE + 65535} (root daemon" in limits["detail"]
        )
    else:
        assert f"agents share the daemon's uid {os.geteuid()} (" in limits["detail"], limits
    assert "held: wall time, /tmp and /dev/shm sizes" in limits["detail"]
    assert (
        "not by the kernel but by farmhost, which ends a run within seconds of passing them: workspace size "
        "(checked before each run and watched during it), and 256 MB left free on the data directory's disk"
    ) in limits["detail"], limits
    support = detect_sync()  # what this host offers, found the way the daemon finds it
    if support.available:
        assert limits["state"] == "ok", limits
        assert f"processes and CPU share per run (cgroup v{support.version}; no RLIMIT_AS" in limits["detail"]
    else:
        assert limits["state"] == "broken" and "agent runs are refused: no cgroup" in limits["detail"], limits
        assert support.reason in limits["detail"] and "FARMHOST_AGENT_UNENFORCED_LIMITS=allow" in limits["fix"]


def test_the_seccomp_filter_is_tried_in_a_real_bwrap_run(data_dir: Path) -> None:
    seccomp = checks(data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable)["seccomp"]
    built = build_filter_sync()
    assert seccomp == {
        "part": "seccomp",
        "state": "ok",
        "detail": (
            f"{built.describe()}; a trial run got EPERM for unshare(CLONE_NEWUSER) and ptrace(PTRACE_TRACEME), "
            "EAFNOSUPPORT for socket(AF_NETLINK)"
        ),
        "fix": "",
    }
    # what the doctor's trial gives without the filter, run the same way: the calls it reports refused go through
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    trial = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/"]
    trial += [sys.executable, "-I", "-c", SECCOMP_TRIAL]
    unfiltered = subprocess.run(trial, capture_output=True, text=True, timeout=scaled(10), check=True)
    assert unfiltered.stdout.split() == ["ok", "ok", "ok"]


def test_seccomp_off_is_a_warning(data_dir: Path) -> None:
    seccomp = checks(
        data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable, FARMHOST_SANDBOX_SECCOMP="off"
    )["seccomp"]
    assert seccomp["state"] == "warn" and seccomp["detail"].startswith("FARMHOST_SANDBOX_SECCOMP=off: bwrap runs have")


def test_a_missing_libseccomp_is_broken(data_dir: Path, tmp_path: Path) -> None:
    # pyseccomp raises this at import on a host without libseccomp2; a module of that name ahead on the path does too
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pyseccomp.py").write_text('raise RuntimeError("Unable to find libseccomp")\n')
    found = checks(
        data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable, PYTHONPATH=str(shadow)
    )
    assert found["sandbox"]["state"] == "ok"
    assert found["seccomp"]["state"] == "broken"
    assert found["seccomp"]["detail"] == (
        "libseccomp cannot be loaded: Unable to find libseccomp: bwrap agent runs are refused"
    )
    assert "FARMHOST_SANDBOX_SECCOMP=off" in found["seccomp"]["fix"]


@pytest.mark.slow  # a real daemon
@pytest.mark.skipif(os.geteuid() != 0, reason="the doctor is run as root beside a daemon of another user")
def test_the_doctor_says_what_the_running_daemon_holds_not_what_its_own_process_could(tmp_path: Path) -> None:
    """An operator's `sudo farmhost doctor` sits in another cgroup than the daemon: it reports the daemon's limits.

    The daemon runs as an ordinary user, who may create no cgroup here, so its runs are refused; the doctor, run as
    root in a cgroup root may write, once said the limits held.
    """
    with as_another_user("farmhost-doctor-") as user:
        env = clean_env(FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=SYSTEM_PYTHON)
        daemon = Daemon(user.data_dir, env=env, python=user.python).start()
        try:
            started = lambda: "agent runtime bwrap" in daemon.log()  # its cgroup look is done by then
            wait_for(started, timeout=scaled(30), what="the agent runtime", seen=lambda: daemon.log()[-3000:])
            assert "agent runs cannot get a cgroup here" in daemon.log(), daemon.log()[-3000:]
            limits = checks(user.data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=SYSTEM_PYTHON)
            check = limits["agent limits"]
            assert check["state"] == "broken", check
            assert f"the running daemon (pid {daemon.proc.pid if daemon.proc else '?'})" in check["detail"], check
            assert "agent runs are refused: no cgroup" in check["detail"], check
            assert daemon.stop() == 0, daemon.log()[-3000:]
        finally:
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon drops to its groups' uids with setpriv")
def test_a_root_host_without_setpriv_is_broken_not_ok(data_dir: Path, tmp_path: Path) -> None:
    """Every run of a root daemon drops to its group's uid with setpriv: without it the sandbox is not `ok`."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    bin_dir = tmp_path / "bin"  # a PATH with bwrap and what the doctor's trial runs, no setpriv
    bin_dir.mkdir()
    (bin_dir / "bwrap").symlink_to(bwrap)
    (bin_dir / "true").symlink_to(shutil.which("true") or "/bin/true")
    env = {"FARMHOST_AGENT_RUNTIME": "bwrap", "FARMHOST_AGENT_PYTHON": sys.executable, "PATH": str(bin_dir)}
    sandbox = checks(data_dir, **env)["sandbox"]
    assert sandbox["state"] == "broken" and "setpriv" in sandbox["detail"], sandbox
    assert "util-linux" in sandbox["fix"], sandbox


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon drops to its groups' uids with setpriv")
async def test_a_root_daemon_without_setpriv_says_so_at_start(data_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The daemon refuses the backend at start (its log says why) instead of failing each run later."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").symlink_to(bwrap)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # the host's PATH, without util-linux
    settings = settings_for(data_dir, FARMHOST_AGENT_RUNTIME="bwrap", FARMHOST_AGENT_PYTHON=sys.executable)
    with pytest.raises(SandboxError, match=r"setpriv \(util-linux\) is needed"):
        await create_backend(build_config(settings).agents.sandbox)
