"""The doctor's checks of the machine under farmhost: Python, data dir ownership, disk, inotify, clock, time zone.

Each function returns one `Check` and never raises for what it finds; thresholds, paths and the clock are
parameters so a test can provoke each state on real files.
"""

from __future__ import annotations

import json
import os
import platform
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Literal
from zoneinfo import ZoneInfo

import farmhost
from farmhost import __version__
from farmhost.cli.health import lock_holder
from farmhost.layout import DataLayout
from farmhost.store import host_state
from farmhost.store.newest import newest_written

State = Literal["ok", "warn", "off", "broken"]

MIN_PYTHON: Final = (3, 11)
# Disk: warn under 1 GiB or 5 % free, broken under 200 MiB (SQLite, logs and agent runs need room to write).
WARN_FREE_BYTES: Final = 1 << 30
WARN_FREE_FRACTION: Final = 0.05
BROKEN_FREE_BYTES: Final = 200 << 20
# inotify: the daemon watches each group's directory and its 3 queues; each agent run and each `farmhost ipc send`
# holds one instance watching one results directory. All of them count against the same user's limits.
WATCHES_PER_GROUP: Final = 4
PROC_INOTIFY: Final = Path("/proc/sys/fs/inotify")
# Clock: no farmhost ran before this, and nothing is recorded this far in the future by a correct clock.
CLOCK_FLOOR: Final = datetime(2025, 1, 1, tzinfo=UTC)
CLOCK_SLACK: Final = timedelta(minutes=10)
TIMEDATECTL_TIMEOUT: Final = 3.0
_UTC_NAMES: Final = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Zulu", "Etc/Zulu", "GMT", "Etc/GMT"})
_SET_CLOCK: Final = (
    "set the clock: `sudo timedatectl set-ntp true` and make sure the network reaches an NTP server "
    "(a Raspberry Pi has no battery clock and starts with a stale time until NTP answers)"
)


@dataclass(frozen=True)
class Check:
    """One line of the report: a part, its state, what was found and (unless ok) how to fix it."""

    part: str
    state: State
    detail: str
    fix: str = ""


def size(n: float) -> str:
    """A byte count for people: `3.2 GiB`, `180 MiB`."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def python_check() -> Check:
    """The interpreter farmhost runs on."""
    version = platform.python_version()
    where = f"{platform.python_implementation()} on {platform.machine()}, {sys.executable}"
    if sys.version_info < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Check("python", "broken", f"{version} ({where})", f"install Python {need} or newer and reinstall")
    return Check("python", "ok", f"{version} ({where})")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def data_dir_check(root: Path) -> Check:
    """The data directory exists, is writable and belongs (with what is in it) to the user running farmhost."""
    if not root.is_dir():
        return Check("data dir", "broken", f"{root} does not exist", f"farmhost init --data-dir {root}")
    uid = os.geteuid()
    me = _user(uid)
    chown = f"sudo chown -R {me}: {root}, or run farmhost as the directory's owner"
    if not os.access(root, os.W_OK):
        return Check("data dir", "broken", f"{root} is not writable by {me}", chown)
    foreign = [(p, st) for p, st in _owned_entries(root) if st.st_uid != uid]
    if not foreign:
        return Check("data dir", "ok", f"{root}, owned by {me}, writable")
    locked = [(p, st) for p, st in foreign if not stat.S_ISLNK(st.st_mode) and not os.access(p, os.W_OK)]
    first, first_stat = (locked or foreign)[0]
    owner = _user(first_stat.st_uid)
    shown = "the directory itself" if first == root else str(first.relative_to(root))
    detail = f"{len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} of {root} belong to another user than {me}"
    detail += f" (e.g. {shown}: {owner})"
    if locked:
        return Check("data dir", "broken", f"{detail}; {len(locked)} not writable by {me}", chown)
    # Writable today (farmhost runs as root?), but what farmhost creates now belongs to another user than before.
    return Check("data dir", "warn", detail, chown)


def _owned_entries(root: Path) -> list[tuple[Path, os.stat_result]]:
    """The directory, its top-level entries and each group's IPC and workspace directory, each with its lstat.

    Their contents are not looked at; an entry gone before it was looked at (SQLite's -wal and -shm come and go) is
    left out.
    """
    entries = [(root, root.lstat())]
    layout = DataLayout(root)
    for parent in (root, layout.ipc, layout.groups):
        try:
            with os.scandir(parent) as listing:
                for entry in listing:
                    try:
                        entries.append((Path(entry.path), entry.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue
        except OSError:
            if parent == root:
                raise
    return entries


def disk_check(
    path: Path,
    *,
    warn_bytes: int = WARN_FREE_BYTES,
    warn_fraction: float = WARN_FREE_FRACTION,
    broken_bytes: int = BROKEN_FREE_BYTES,
) -> Check:
    """Free space on the filesystem that holds (or will hold) `path`."""
    target = path
    while not target.exists() and target != target.parent:  # the filesystem the data dir will live on
        target = target.parent
    mount = target.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    usage = shutil.disk_usage(target)
    share = usage.free / usage.total if usage.total else 0.0
    detail = f"{size(usage.free)} free of {size(usage.total)} ({share:.0%}) on {mount}"
    fix = (
        f"free space on {mount}: old agent run logs are in logs/runs/, rotated request logs in logs/; "
        "`docker system prune` removes unused images; or move the data dir to a bigger disk"
    )
    if usage.free < broken_bytes:
        return Check("disk", "broken", f"{detail}: below {size(broken_bytes)}, writes will fail", fix)
    if usage.free < warn_bytes or share < warn_fraction:
        return Check("disk", "warn", f"{detail}: below {size(warn_bytes)} or {warn_fraction:.0%}", fix)
    return Check("disk", "ok", detail)


@dataclass(frozen=True)
class InotifyUse:
    """inotify instances and watches held by the processes of one user that this process can see."""

    instances: int = 0
    watches: int = 0


def inotify_in_use(uid: int, *, exclude: set[int] | None = None, proc: Path = Path("/proc")) -> InotifyUse:
    """Count the inotify instances and watches of `uid`'s processes (best effort: unreadable ones are skipped)."""
    instances = watches = 0
    skip = exclude or set()
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return InotifyUse()
    for pid in pids:
        if pid in skip:
            continue
        try:
            if os.stat(proc / str(pid)).st_uid != uid:
                continue
            fds = os.listdir(proc / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / str(pid) / "fd" / fd) != "anon_inode:inotify":
                    continue
                info = (proc / str(pid) / "fdinfo" / fd).read_text()
            except OSError:
                continue
            instances += 1
            watches += sum(1 for line in info.splitlines() if line.startswith("inotify wd:"))
    return InotifyUse(instances, watches)


def inotify_needs(groups: int, max_agents: int) -> tuple[int, int]:
    """(watches, instances) farmhost needs: the daemon's watches, one per agent run at once, one CLI `ipc send`."""
    return WATCHES_PER_GROUP * max(groups, 1) + max_agents + 1, 1 + max_agents + 1


def inotify_check(
    *,
    groups: int,
    max_agents: int,
    ipc_mode: str = "inotify",
    poll_seconds: float = 0.5,
    proc_sys: Path = PROC_INOTIFY,
    in_use: InotifyUse | None = None,
) -> Check:
    """The user's inotify limits against what farmhost needs for `groups` groups (and what is used already)."""
    if ipc_mode == "poll":
        return Check("inotify", "off", f"FARMHOST_IPC_MODE=poll (every {poll_seconds:g} s)")
    try:
        from inotify_simple import INotify

        INotify().close()
        watch_limit = int((proc_sys / "max_user_watches").read_text())
        instance_limit = int((proc_sys / "max_user_instances").read_text())
    except (OSError, ValueError) as err:
        return Check("inotify", "broken", f"inotify unavailable: {err}", "set FARMHOST_IPC_MODE=poll")
    need_watches, need_instances = inotify_needs(groups, max_agents)
    used = in_use if in_use is not None else InotifyUse()
    me = _user(os.getuid())
    detail = (
        f"max_user_watches {watch_limit:,} (farmhost needs {need_watches:,} for {groups} group(s) and "
        f"{max_agents} agent run(s) at once), max_user_instances {instance_limit:,} (needs {need_instances}); "
        f"in use by {me}'s other processes: {used.watches:,} watch(es), {used.instances} instance(s)"
    )
    want_watches = max(8192, 2 * (used.watches + need_watches), watch_limit)
    want_instances = max(256, 2 * (used.instances + need_instances), instance_limit)
    fix = (
        f"sudo sysctl fs.inotify.max_user_watches={want_watches} fs.inotify.max_user_instances={want_instances}, "
        "and keep it with the same two lines (without sudo sysctl) in /etc/sysctl.d/60-farmhost.conf; "
        "or set FARMHOST_IPC_MODE=poll"
    )
    if watch_limit < need_watches or instance_limit < need_instances:
        return Check("inotify", "broken", detail, fix)
    if watch_limit < used.watches + need_watches or instance_limit < used.instances + need_instances:
        return Check("inotify", "warn", f"{detail}: not enough left for farmhost", fix)
    return Check("inotify", "ok", detail)


def daemon_pid(data_dir: Path) -> int | None:
    """The pid of the farmhost daemon running on `data_dir` (from its lock file), if it is alive."""
    try:
        pid = int(DataLayout(data_dir).lock_path.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"farmhost" in cmdline else None


@dataclass(frozen=True, kw_only=True)
class DaemonWalls:
    """What the running daemon recorded of its agents' walls at its start (host_state AGENT_WALLS)."""

    pid: int
    ids: str
    cgroup_version: Literal[1, 2] | None
    cgroup_reason: str


def running_walls(data_dir: Path) -> DaemonWalls | None:
    """The walls the daemon holding `data_dir`'s lock recorded; None when none runs or it recorded nothing yet."""
    layout = DataLayout(data_dir)
    pid = lock_holder(layout.lock_path)
    if pid is None or not layout.db_path.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"file:{layout.db_path}?mode=ro", uri=True, timeout=2)) as conn:
            recorded = host_state.get(conn, host_state.AGENT_WALLS)
        record = json.loads(recorded) if recorded else None
    except (sqlite3.Error, ValueError):
        return None
    if not isinstance(record, dict) or record.get("pid") != pid:
        return None  # a record of an earlier daemon, or this one has not reached its agent runtime yet
    cgroup = record.get("cgroup")
    version = cgroup.get("version") if isinstance(cgroup, dict) else None
    reason = cgroup.get("reason") if isinstance(cgroup, dict) else None
    return DaemonWalls(
        pid=pid,
        ids=str(record.get("ids", "")),
        cgroup_version=version if version in (1, 2) else None,
        cgroup_reason=str(reason) if reason else "the daemon's bwrap agent runtime is not running (see its log)",
    )


def newest_record(db_path: Path) -> datetime | None:
    """The latest "written at" time in farmhost.db (read-only; None without a database or records)."""
    if not db_path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return None
    try:
        return newest_written(conn)
    finally:
        conn.close()


def installed_at() -> datetime:
    """When the installed farmhost was written: the newest modification time of its modules."""
    package = Path(farmhost.__file__).parent
    newest = max((p.stat().st_mtime for p in package.rglob("*.py")), default=0.0)
    return datetime.fromtimestamp(newest, UTC)


def ntp_synchronized(timedatectl: str | None = "timedatectl") -> bool | None:
    """`timedatectl show -p NTPSynchronized`: True/False, or None where it cannot say (no systemd, no binary)."""
    binary = shutil.which(timedatectl) if timedatectl else None
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "show", "-p", "NTPSynchronized", "--value"],
            capture_output=True,
            text=True,
            timeout=TIMEDATECTL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = done.stdout.strip().lower()
    if done.returncode != 0 or answer not in ("yes", "no"):
        return None
    return answer == "yes"


def clock_check(
    db_path: Path,
    *,
    now: datetime | None = None,
    floor: datetime | None = None,
    timedatectl: str | None = "timedatectl",
) -> Check:
    """The system clock is not obviously wrong, and NTP keeps it right where systemd can tell."""
    current = now or datetime.now(UTC)
    shown = current.strftime("%Y-%m-%d %H:%M:%S UTC")
    earliest = floor or max(CLOCK_FLOOR, installed_at())
    if current + CLOCK_SLACK < earliest:
        detail = f"the clock says {shown}, before farmhost {__version__} was installed ({earliest:%Y-%m-%d %H:%M} UTC)"
        return Check("clock", "broken", detail, _SET_CLOCK)
    newest = newest_record(db_path)
    if newest is not None and newest > current + CLOCK_SLACK:
        ahead = newest - current
        detail = (
            f"the clock says {shown}, but farmhost.db has a record from {newest:%Y-%m-%d %H:%M} UTC "
            f"({_duration(ahead)} later): the clock went back; schedules and certificates need the right time"
        )
        return Check("clock", "broken", detail, _SET_CLOCK)
    synced = ntp_synchronized(timedatectl)
    if synced is False:
        return Check("clock", "warn", f"{shown}, but NTP is not synchronised", _SET_CLOCK)
    ntp = "NTP synchronised" if synced else "NTP state unknown (no timedatectl answer)"
    return Check("clock", "ok", f"{shown}, {ntp}")


def _duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.0f} hours"
    return f"{seconds / 60:.0f} minutes"


def timezone_check(tz: str | None, zone: ZoneInfo, *, now: datetime | None = None) -> Check:
    """Which zone farmhost uses for cron, `once` and dates; a UTC default on an unset TZ is usually a mistake."""
    local = (now or datetime.now(UTC)).astimezone(zone)
    clock = f"local time {local:%H:%M} {local.tzname()} (UTC{local:%z})"
    if tz:
        return Check("timezone", "ok", f"{zone.key} (from TZ), {clock}")
    if zone.key in _UTC_NAMES:
        return Check(
            "timezone",
            "warn",
            f"{zone.key} (TZ is not set and the system zone is UTC): cron tasks and dates use UTC",
            "set TZ to the farm's zone in .env, e.g. TZ=Europe/Lisbon (an IANA name)",
        )
    return Check("timezone", "ok", f"{zone.key} (the system zone; set TZ to pin it), {clock}")
