"""One identity per group (issue 33, findings 4 and 5): a root daemon's runs get a host uid of their group's own.

Through the real daemon and real runs, in bwrap and in a container of the agent image (the `sandbox` fixture; docker
skips without an engine): while main's run holds every process and inotify instance its uid may have, field's run
still forks and watches; the files a run writes belong to its group's uid; two groups never share an id, and a
group keeps its id over a restart of the daemon.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import sqlite3
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import Daemon, clean_env, drop, init_data_dir_in_process, ok, once_time, wait_for, wait_result
from runtime_support import SYSTEM_PYTHON, Sandbox, as_another_user

from farmhost.agents.sandbox.backends.share import inotify_share
from farmhost.config import AGENT_UID_BASE

pytestmark = [
    pytest.mark.slow,  # a real daemon and real agent runs
    pytest.mark.skipif(os.geteuid() != 0, reason="per-group uids are given by a root daemon (docs/security.md)"),
]

ZONE: Final = "Europe/Lisbon"
PIDS: Final = 16  # the runs' process limit: small, so the hog reaches it at once
INOTIFY: Final = 160  # more inotify instances than the kernel's 128 per uid, so the hog takes every one its uid has

# The agent (kind `command`): forks up to `forks` children and opens up to `inotify` inotify instances, says how
# far it got in report-<name>.json of its workspace (what the host sees of its files too), then holds all of them
# until `release` appears there (`hold`), and ends with the report as its answer.
PROBE = r"""
import ctypes, errno, json, os, sys, time
job = json.load(sys.stdin)
prompt = job["prompt"]
todo = json.loads(prompt[prompt.index("{"):])
ws = os.environ["FARMAGENT_GROUP_DIR"]
libc = ctypes.CDLL(None, use_errno=True)
report = {"uid": os.getuid(), "gid": os.getgid()}
kids, failed = [], None
for _ in range(todo["forks"]):
    try:
        pid = os.fork()
    except OSError as err:
        failed = errno.errorcode[err.errno]
        break
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    kids.append(pid)
report["forks"] = [len(kids), failed]
fds, failed = [], None
for _ in range(todo["inotify"]):
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        failed = errno.errorcode[ctypes.get_errno()]
        break
    fds.append(fd)
report["inotify"] = [len(fds), failed]
path = f"{ws}/report-{todo['name']}.json"
with open(path + ".tmp", "w") as f:
    json.dump(report, f)
os.rename(path + ".tmp", path)
deadline = time.monotonic() + 300
while todo.get("hold") and not os.path.exists(f"{ws}/release") and time.monotonic() < deadline:
    time.sleep(0.05)
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps({"status": "ok", "answer": json.dumps(report), "error": None, "turns": 1, "toolCalls": 0}))
"""


def _schedule(data_dir: Path, folder: str, **todo: Any) -> None:
    """A once-task of `folder`, due as soon as the daemon surely has it, whose prompt tells the probe what to do."""
    due = once_time(data_dir, folder, ZoneInfo(ZONE))
    task = {"type": "schedule_task", "prompt": json.dumps(todo), "schedule_type": "once"}
    rid = drop(data_dir, folder, "tasks", {**task, "schedule_value": due.strftime("%Y-%m-%dT%H:%M:%S")})
    ok(wait_result(data_dir, folder, rid))


def _report(daemon: Daemon, folder: str, name: str) -> dict[str, Any]:
    path = daemon.data_dir / "groups" / folder / f"report-{name}.json"
    seen = lambda: daemon.log()[-1500:]  # what the daemon said of the run
    wait_for(path.exists, timeout=60, what=f"{folder}'s run to write {path.name}", seen=seen)
    report: dict[str, Any] = json.loads(path.read_text())
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (report["uid"], report["gid"]), "the file is the run's uid's"
    return report


def _allocated(data_dir: Path) -> dict[str, int]:
    with sqlite3.connect(data_dir / "farmhost.db") as conn:
        return dict(conn.execute("SELECT folder, uid FROM agent_ids"))


def test_groups_get_their_own_uids_so_one_cannot_starve_another(tmp_path: Path, sandbox: Sandbox) -> None:
    data_dir = init_data_dir_in_process(tmp_path / "data")
    # a range of this test's own: other tests' daemons on this host allocate from the default one
    base = AGENT_UID_BASE + 65536 * random.randrange(1, 4096)
    command = (*sandbox.command[:2], PROBE)
    env = clean_env(
        TZ=ZONE,
        **sandbox.values,
        **sandbox.env,
        FARMHOST_AGENT_KIND="command",
        FARMHOST_AGENT_COMMAND=shlex.join(command),
        FARMHOST_AGENT_PIDS=str(PIDS),
        FARMHOST_MAX_AGENTS="2",
        FARMHOST_AGENT_UID_BASE=str(base),
    )
    daemon = Daemon(data_dir, env=env).start()
    try:
        _schedule(data_dir, "main", name="hog", forks=4 * PIDS, inotify=INOTIFY, hold=True)
        hog = _report(daemon, "main", "hog")
        assert hog["forks"][1] == "EAGAIN" and hog["forks"][0] < PIDS, hog
        # 128 a uid (fs.inotify.max_user_instances) in bwrap; docker holds its own count in the engine's namespace
        assert hog["inotify"][1] == "EMFILE" or hog["inotify"][0] == INOTIFY, hog
        # main's run holds all of that while field's run starts
        _schedule(data_dir, "field", name="neighbour", forks=PIDS // 2, inotify=8)
        neighbour = _report(daemon, "field", "neighbour")
        assert neighbour["forks"] == [PIDS // 2, None], ("field could not fork while main held its uid's", neighbour)
        assert neighbour["inotify"] == [8, None], ("field got no inotify instance while main held them", neighbour)
        (data_dir / "groups" / "main" / "release").touch()
        ids = {hog["uid"], neighbour["uid"]}
        assert len(ids) == 2 and all(base <= uid < base + 65536 for uid in ids), (hog, neighbour)
        assert hog["gid"] == hog["uid"] and neighbour["gid"] == neighbour["uid"]
        assert os.getuid() not in ids
        assert _allocated(data_dir) == {"main": hog["uid"], "field": neighbour["uid"]}
        workspace = (data_dir / "groups" / "field").stat()
        assert workspace.st_uid == neighbour["uid"], "the group's workspace is handed to its uid"
        assert (data_dir / "ipc" / "field").stat().st_uid == neighbour["uid"], "so is its IPC directory"
        wait_for(lambda: "for main ended: ok" in daemon.log(), timeout=60, what="main's run to end")
        assert daemon.stop() == 0, daemon.log()[-3000:]
        # a restart: each group keeps its id (the table, not the order of first runs, decides)
        daemon = Daemon(data_dir, env=env).start()
        for folder in ("field", "main"):
            _schedule(data_dir, folder, name="again", forks=1, inotify=1)
        again = {folder: _report(daemon, folder, "again")["uid"] for folder in ("main", "field")}
        assert again == {"main": hog["uid"], "field": neighbour["uid"]}
        assert daemon.stop() == 0, daemon.log()[-3000:]
    finally:
        (data_dir / "groups" / "main" / "release").touch()
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()


def test_a_daemon_that_is_not_root_keeps_each_run_to_its_own_share(sandbox: Sandbox) -> None:
    """All runs share the daemon's uid; each run's limits are set inside its own user namespace (share.py)."""
    if sandbox.name != "bwrap":
        pytest.skip("a daemon that is not root runs docker agents as the data directory's owner (engine's own ids)")
    with as_another_user("farmhost-user-") as user:
        data_dir, uid = user.data_dir, user.uid
        command = (SYSTEM_PYTHON, "-c", PROBE)  # the user cannot reach the tests' own interpreter under /root
        env = clean_env(
            TZ=ZONE,
            **sandbox.values,
            FARMHOST_AGENT_PYTHON=SYSTEM_PYTHON,
            FARMHOST_AGENT_KIND="command",
            FARMHOST_AGENT_COMMAND=shlex.join(command),
            FARMHOST_AGENT_PIDS=str(PIDS),
            FARMHOST_MAX_AGENTS="2",
            FARMHOST_AGENT_UNENFORCED_LIMITS="allow",  # cgroups are root's here: the per-uid limits are what holds
        )
        daemon = Daemon(data_dir, env=env, python=user.python).start()
        try:
            _schedule(data_dir, "main", name="hog", forks=4 * PIDS, inotify=INOTIFY, hold=True)
            hog = _report(daemon, "main", "hog")
            _schedule(data_dir, "field", name="neighbour", forks=PIDS // 2, inotify=8)
            neighbour = _report(daemon, "field", "neighbour")
            (data_dir / "groups" / "main" / "release").touch()
            assert hog["uid"] == neighbour["uid"] == uid, "a daemon that is not root runs its agents as itself"
            assert hog["forks"][1] == "EAGAIN" and hog["forks"][0] < PIDS, hog
            assert neighbour["forks"] == [PIDS // 2, None], (
                "field could not fork while main held its share",
                hog,
                neighbour,
            )
            # each run gets its share of the uid's instances, the daemon keeps one: no run can take them all
            assert hog["inotify"] == [inotify_share(2), "EMFILE"], hog
            assert neighbour["inotify"] == [8, None], ("field got no inotify instance", hog, neighbour)
            assert "cannot create an inotify instance" not in daemon.log(), "the daemon's own were taken"
            assert daemon.stop() == 0, daemon.log()[-3000:]
        finally:
            (data_dir / "groups" / "main" / "release").touch()
            if daemon.proc is not None and daemon.proc.poll() is None:
                daemon.kill()
