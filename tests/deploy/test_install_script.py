"""deploy/install.sh into a throw-away prefix: the installed farmhost works as a non-root user, agents included.

The test runs as root (as CI does). One install (as root, `--no-systemd --user nobody --with-opencode`) is shared by
the module: it takes ~8 s here with uv's cache warm (most of it compiling bytecode), plus ~1 s copying OpenCode from
the checkout's .tools/opencode (`make opencode`; without it the installer fetches the npm package); a second run
takes ~2 s. Everything the daemon's user does is run as that
user (`setpriv`), so no root-owned file ends up in its data directory.
"""

from __future__ import annotations

import grp
import json
import os
import platform
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from farmhost_testing import clean_env, hold_for, scaled, wait_for
from llm_stub import Reply, ScriptedLLM, ToolCall

from farmhost.agents.kinds import OPENCODE_VERSION

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "install.sh"
USER = "nobody"
MAIN_JID = "telegram:100"


@dataclass(frozen=True)
class Install:
    root: Path
    prefix: Path
    data_dir: Path
    config_dir: Path
    output: str

    @property
    def farmhost(self) -> str:
        return str(self.prefix / "bin" / "farmhost")


def _install(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean_env(),
        timeout=scaled(300),
    )


def _as_user(*argv: str) -> list[str]:
    """`argv` run as the daemon's user, with this environment (setpriv execs: the pid is the command's)."""
    account = pwd.getpwnam(USER)
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", "--", *argv]


def _run_as_user(install: Install, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _as_user(install.farmhost, *args, "--data-dir", str(install.data_dir)),
        check=False,
        capture_output=True,
        text=True,
        cwd=install.root,
        env=env or clean_env(),
        timeout=scaled(60),
    )


@pytest.fixture(scope="module")
def installed() -> Iterator[Install]:
    # Not under pytest's tmp_path: that is 0700 root, and the daemon's user must reach the prefix and data dir.
    root = Path(tempfile.mkdtemp(prefix="farmhost-install-"))
    root.chmod(0o755)
    install = Install(root, root / "prefix", root / "data", root / "etc", "")
    args = (
        "--prefix",
        str(install.prefix),
        "--data-dir",
        str(install.data_dir),
        "--config-dir",
        str(install.config_dir),
    )
    done = _install(*args, "--no-systemd", "--user", USER, "--with-opencode", cwd=root)
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield Install(root, install.prefix, install.data_dir, install.config_dir, done.stdout)
    finally:
        shutil.rmtree(root)


@pytest.mark.slow
def test_the_installed_farmhost_runs_and_its_doctor_passes_as_the_daemon_user(installed: Install) -> None:
    for n in range(1, 9):
        assert f"[{n}/8]" in installed.output  # progress, step by step
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run([installed.farmhost, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"farmhost {version}"
    assert (installed.prefix / "bin" / "python").exists() and (installed.prefix / "pyvenv.cfg").is_file()
    # The voice extra is installed by default: the embedded engine and the Wyoming client import in the prefix.
    engines = "import faster_whisper, ctranslate2, av, wyoming; print('voice ok')"
    python = installed.prefix / "bin" / "python"
    voice = subprocess.run([python, "-c", engines], check=False, capture_output=True, text=True)
    assert voice.stdout.strip() == "voice ok", voice.stderr
    # The data dir belongs to the daemon's user and was initialised by it.
    owner = pwd.getpwnam(USER).pw_uid
    assert installed.data_dir.stat().st_uid == owner and (installed.data_dir / "farmhost.db").stat().st_uid == owner
    # Installed without systemd, an unprivileged daemon gets no delegated cgroup: the doctor says runs would be
    # refused, and what to do; with the operator's leave (FARMHOST_AGENT_UNENFORCED_LIMITS=allow) it passes.
    refused = {c["part"]: c for c in json.loads(_run_as_user(installed, "doctor", "--json").stdout)}["agent limits"]
    assert refused["state"] == "broken" and "agent runs are refused: no cgroup" in refused["detail"], refused
    assert "FARMHOST_AGENT_UNENFORCED_LIMITS=allow" in refused["fix"]
    doctor = _run_as_user(installed, "doctor", "--json", env=clean_env(FARMHOST_AGENT_UNENFORCED_LIMITS="allow"))
    checks = {c["part"]: c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert checks["sandbox"]["state"] == "ok", checks["sandbox"]
    assert (
        "bwrap" in checks["sandbox"]["detail"]
        and str(installed.prefix / "bin" / "python") in checks["sandbox"]["detail"]
    )
    assert checks["database"]["state"] == "ok"
    # The settings file is the commented template, readable by the daemon's group only.
    env_file = installed.config_dir / "farmhost.env"
    assert env_file.read_text() == (REPO / ".env.example").read_text()
    assert env_file.stat().st_mode & 0o777 == 0o640 and env_file.stat().st_gid == pwd.getpwnam(USER).pw_gid
    # Nothing of the checkout but the package and what it seeds from: no .env, no tests, no .venv.
    assert sorted(p.name for p in (installed.prefix / "src").iterdir()) == [
        "LICENSE", "README.md", "container", "dashboards", "farmhost", "hatch_build.py", "memory", "pyproject.toml",
        "uv.lock",
    ]  # fmt: skip


@pytest.mark.slow
def test_opencode_is_installed_in_the_prefix_where_the_installed_farmhost_finds_it(installed: Install) -> None:
    arch = {"x86_64": "x64", "aarch64": "arm64"}[platform.machine()]
    binary = installed.prefix / "opencode" / "node_modules" / f"opencode-linux-{arch}" / "bin" / "opencode"
    assert f"OpenCode {OPENCODE_VERSION}" in installed.output and str(binary) in installed.output
    # The installed farmhost, as the daemon's user and with no setting pointing at it, finds that binary...
    probe = "from farmhost.agents.kinds import opencode_binary; print(opencode_binary(None))"
    found = subprocess.run(
        _as_user(str(installed.prefix / "bin" / "python"), "-c", probe),
        check=True, capture_output=True, text=True, cwd=installed.root, env=clean_env(), timeout=scaled(60),
    )  # fmt: skip
    assert found.stdout.strip() == str(binary)
    # ...which that user can run, at the pinned version (OpenCode makes its data dir under a writable HOME).
    home = installed.root / "opencode-home"
    home.mkdir()
    account = pwd.getpwnam(USER)
    os.chown(home, account.pw_uid, account.pw_gid)
    version = subprocess.run(
        _as_user(str(binary), "--version"),
        check=True, capture_output=True, text=True, cwd=installed.root, env=clean_env(HOME=str(home)),
        timeout=scaled(60),
    )  # fmt: skip
    assert version.stdout.strip() == OPENCODE_VERSION


def _unit(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.slow
def test_the_unit_has_the_install_paths_and_keeps_bwrap_working(installed: Install) -> None:
    path = installed.prefix / "share" / "farmhost" / "farmhost.service"
    text = path.read_text()
    unit = _unit(text)
    data = str(installed.data_dir)
    assert unit["ExecStart"] == [f"{installed.prefix}/bin/farmhost run --data-dir {data}"]
    assert unit["EnvironmentFile"] == [f"{installed.config_dir}/farmhost.env"]
    assert unit["WorkingDirectory"] == [data] and unit["ReadWritePaths"] == [data]
    assert unit["User"] == [USER] and unit["Group"] == [grp.getgrgid(pwd.getpwnam(USER).pw_gid).gr_name]
    rest = text
    for installed_path in (installed.prefix, installed.data_dir, installed.config_dir):
        rest = rest.replace(str(installed_path), "<install path>")
    assert "/opt/farmhost" not in rest and "/var/lib/farmhost" not in rest and "/etc/farmhost" not in rest
    assert unit["Restart"] == ["on-failure"] and unit["TimeoutStopSec"] == ["15"] and unit["KillMode"] == ["mixed"]
    assert unit["MemoryMax"] and unit["TasksMax"] and unit["StandardError"] == ["journal"]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    # What would stop bwrap from making its namespaces or mounting its /proc is not there.
    for key in ("RestrictNamespaces", "PrivateUsers", "ProtectKernelTunables", "ProtectKernelLogs", "ProtectProc"):
        assert key not in unit, key
    assert "ProcSubset" not in unit and "SystemCallFilter" not in unit
    # systemd's own check: every directive known, the command executable.
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(path)], check=False, capture_output=True, text=True, timeout=scaled(60)
    )
    # (It rightly calls `nobody` unsafe for a service: install.sh refuses it unless --no-systemd, as here.)
    complaints = [line for line in verify.stderr.splitlines() if "Special user nobody configured" not in line]
    assert verify.returncode == 0 and complaints == [] and verify.stdout.strip() == "", verify


def _schedule_in(install: Install, cli_took: float, prompt: str, env: dict[str, str]) -> float:
    """A once task due soon after `ipc send` reaches the daemon; returns how many seconds ahead it was due.

    The due time is set before the CLI starts, a hold sized by how long a CLI call took (`cli_took`) ahead. On a
    loaded machine a call can take far longer than the one measured (14 s once, against 3.3 s): the daemon then
    answers that the time is past, and the task is sent again, held by how long that call took.
    """
    for _ in range(3):
        ahead = 1 + hold_for(cli_took, least=1)
        due = (datetime.now(UTC) + timedelta(seconds=ahead)).strftime("%Y-%m-%dT%H:%M:%S")
        request = {"type": "schedule_task", "prompt": prompt, "schedule_type": "once", "schedule_value": due}
        started = time.monotonic()
        sent = _run_as_user(
            install, "ipc", "send", "--group", "main", "--queue", "tasks", "--json", json.dumps(request), env=env
        )
        if sent.returncode == 0 or "is in the past" not in sent.stdout:
            break
        cli_took = time.monotonic() - started
    assert sent.returncode == 0, sent.stdout + sent.stderr
    return ahead


def _finished_runs(install: Install, env: dict[str, str]) -> list[str]:
    """The statuses of the tasks' last runs once none is still going on (the run log is written before that)."""
    done = _run_as_user(install, "task", "list", "--all", "--json", env=env)
    assert done.returncode == 0, done.stderr
    statuses = [t["lastRunStatus"] for t in json.loads(done.stdout)]
    return statuses if statuses and all(s not in (None, "running") for s in statuses) else []


def _outbox(install: Install, env: dict[str, str]) -> list[dict[str, Any]]:
    done = _run_as_user(install, "outbox", "list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    entries: list[dict[str, Any]] = json.loads(done.stdout)
    return entries


@pytest.mark.slow
def test_an_agent_runs_in_bwrap_from_the_installed_prefix_as_the_daemon_user(
    installed: Install, llm_stub: ScriptedLLM
) -> None:
    env = clean_env(
        TZ="UTC",
        FARMHOST_AGENT_RUNTIME="bwrap",
        FARMHOST_LLM_BASE_URL=llm_stub.base_url,
        FARMHOST_LLM_MODEL="farm-model",
        FARMHOST_LLM_API_KEY="sk-install-test",
        FARMHOST_HEARTBEAT_SECONDS="1",
        FARMHOST_AGENT_UNENFORCED_LIMITS="allow",  # no systemd here to delegate a cgroup to the daemon's user
    )
    added = _run_as_user(
        installed, "group", "add", "--jid", MAIN_JID, "--name", "Farm office", "--folder", "main", "--main", env=env
    )
    assert added.returncode == 0, added.stderr
    llm_stub.script(ToolCall("send_message", {"chatJid": MAIN_JID, "text": "Soil is fine."}), Reply("Told them."))
    log = installed.root / "daemon.log"
    with open(log, "wb") as out:
        argv = _as_user(installed.farmhost, "run", "--data-dir", str(installed.data_dir))
        daemon = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=installed.root)
    try:
        status = installed.data_dir / "ipc" / "main" / "host_status.json"
        wait_for(
            lambda: status.exists() and json.loads(status.read_text())["status"] == "alive",
            timeout=20,
            what=f"the daemon to report alive in {status}",
            seen=lambda: log.read_text(errors="replace")[-3000:],
        )
        started = time.monotonic()
        health = _run_as_user(installed, "health", env=env)
        cli_took = time.monotonic() - started  # the CLI's start, which `ipc send` pays again before the due time
        assert health.returncode == 0 and health.stdout.startswith("healthy: daemon pid"), health.stdout
        ahead = _schedule_in(installed, cli_took, "Check the soil and tell the office.", env)
        entries = wait_for(
            lambda: _outbox(installed, env), timeout=ahead + 40, interval=0.5, what="the agent's message"
        )
        assert [e["body"] for e in entries] == ["Soil is fine."]
        # The run log is written when the run ends, a moment after its message: wait for the run's end, then read.
        runs = wait_for(lambda: _finished_runs(installed, env), timeout=20, interval=0.2, what="the task's run to end")
        assert runs == ["ok"], runs
        logs = installed.data_dir / "logs" / "runs" / "main"
        run_logs = sorted(logs.glob("run-*.log"))
        assert len(run_logs) == 1, run_logs
        # The agent ran as the daemon's user in bwrap, from the installed interpreter.
        run_log = run_logs[0].read_text()
        assert "bwrap" in run_log and str(installed.prefix / "bin" / "python") in run_log, run_log
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=scaled(15))
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()


@pytest.mark.slow
def test_running_it_again_keeps_the_settings_and_the_data(installed: Install) -> None:
    env_file = installed.config_dir / "farmhost.env"
    env_file.write_text(env_file.read_text() + "TZ=Europe/Lisbon\n")
    marker = installed.data_dir / "groups" / "kept.txt"
    subprocess.run(_as_user("touch", str(marker)), check=True)
    db_inode = (installed.data_dir / "farmhost.db").stat().st_ino
    args = ("--prefix", str(installed.prefix), "--data-dir", str(installed.data_dir))
    again = _install(
        *args, "--config-dir", str(installed.config_dir), "--no-systemd", "--user", USER, cwd=installed.root
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "kept" in again.stdout
    assert f"OpenCode {OPENCODE_VERSION} kept" in again.stdout  # installed once, kept at the pinned version
    assert env_file.read_text().endswith("TZ=Europe/Lisbon\n") and marker.exists()
    assert (installed.data_dir / "farmhost.db").stat().st_ino == db_inode
    assert not (installed.prefix / "src.new").exists() and not (installed.prefix / "src.old").exists()
    done = subprocess.run([installed.farmhost, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("farmhost ")


def test_root_without_a_user_is_refused_before_anything_changes(tmp_path: Path) -> None:
    done = _install("--prefix", str(tmp_path / "p"), "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 2
    assert "refusing to install a root daemon" in done.stderr and "--user" in done.stderr
    assert "--no-systemd" in done.stderr
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (("--config-dir", "{p}/etc"), "--config-dir must not be inside --prefix"),
        (("--data-dir", "{p}/data"), "--data-dir must not be inside --prefix"),
        (("--prefix", "/home/farm/opt", "--user", "farmhost"), "cannot see /home"),
        (("--frobnicate",), "unknown option: --frobnicate"),
        (("--user", "nobody"), "a dedicated user"),
        (("--user", "root"), "refusing to install a root daemon"),
    ],
)
def test_paths_that_would_leak_or_break_are_refused(tmp_path: Path, extra: tuple[str, ...], reason: str) -> None:
    prefix = tmp_path / "p"
    args = [a.format(p=prefix) for a in ("--prefix", "{p}", "--data-dir", str(tmp_path / "d"), *extra)]
    systemd = [] if "--user" in extra else ["--no-systemd"]
    done = _install(*args, *systemd, cwd=tmp_path)
    assert done.returncode == 2 and reason in done.stderr, done.stderr
    assert sorted(tmp_path.iterdir()) == []


def test_a_dry_run_prints_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    args = ("--prefix", str(tmp_path / "p"), "--data-dir", str(tmp_path / "d"), "--config-dir", str(tmp_path / "c"))
    done = _install(*args, "--dry-run", "--user", "farmhost-never-created", "--with-opencode", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "dry run: nothing is changed" in done.stdout
    assert re.search(r"would run: useradd --system .* farmhost-never-created", done.stdout)
    assert re.search(r"would run: \S+ sync --quiet --frozen --no-dev --extra voice", done.stdout)
    without = _install(*args, "--dry-run", "--no-systemd", "--without-voice", cwd=tmp_path)
    assert without.returncode == 0, without.stderr
    assert re.search(r"would run: \S+ sync --quiet --frozen --no-dev --directory", without.stdout), without.stdout
    assert "would run: install -m 0644" in done.stdout and "farmhost.service" in done.stdout
    assert re.search(rf"would run: (cp -a \S+/opencode-ai|\S+/opencode-install) .*{tmp_path}/p/opencode", done.stdout)
    assert sorted(tmp_path.iterdir()) == []
    assert subprocess.run(["id", "farmhost-never-created"], check=False, capture_output=True).returncode != 0
