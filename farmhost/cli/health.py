"""`farmhost health`: whether the daemon of a data directory is running and beating (container/systemd checks).

The daemon holds an exclusive flock on `farmhost.lock` (with its pid written in it) and refreshes
`ipc/<folder>/host_status.json` of every registered group each `FARMHOST_HEARTBEAT_SECONDS`. This command
reads both and never takes the lock itself: a probe that held it, even briefly, could make a daemon that is
starting at that moment refuse to start. It reads the group registry through a read-only connection.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from farmhost.config import Settings
from farmhost.layout import DataLayout
from farmhost.protocol.codes import HOST_STATUS
from farmhost.store import groups

# A heartbeat older than this many intervals (but never less than MIN_MAX_AGE) means the daemon is stuck or gone.
STALE_HEARTBEATS: Final = 3
# Writing sixteen heartbeats with fsync on a busy SD card can take seconds: do not call a slow card a dead daemon.
MIN_MAX_AGE: Final = 30.0
PROC_LOCKS: Final = Path("/proc/locks")


@dataclass(frozen=True)
class Health:
    """The verdict and the one line that explains it."""

    healthy: bool
    detail: str


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `health`."""
    p = sub.add_parser(
        "health",
        parents=[common],
        help="exit 0 when the daemon runs and its heartbeat is fresh (for health checks)",
        description="Exit 0 when a daemon holds the data directory's lock and the newest heartbeat of the "
        "registered groups (ipc/<folder>/host_status.json) says alive and is recent; exit 1 otherwise. "
        "With no group registered yet, a daemon holding the lock is healthy. Prints one line. Run it where the "
        "daemon runs (inside its container): the pid in farmhost.lock is the daemon's pid there. Used by the "
        "Docker image's HEALTHCHECK (docs/deployment.md).",
    )
    p.add_argument(
        "--max-age",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"oldest acceptable heartbeat (default: {STALE_HEARTBEATS} x FARMHOST_HEARTBEAT_SECONDS, "
        f"at least {MIN_MAX_AGE:g})",
    )
    p.set_defaults(func=health)


def health(args: argparse.Namespace, settings: Settings) -> int:
    """Print the verdict; exit 0 healthy, 1 not."""
    max_age = (
        args.max_age if args.max_age is not None else max(MIN_MAX_AGE, STALE_HEARTBEATS * settings.heartbeat_seconds)
    )
    verdict = check_health(settings.data_dir, max_age=max_age)
    print(f"{'healthy' if verdict.healthy else 'unhealthy'}: {verdict.detail}")
    return 0 if verdict.healthy else 1


def check_health(data_dir: Path, *, max_age: float, now: datetime | None = None) -> Health:
    """Judge the daemon of `data_dir` from its lock and its heartbeats."""
    layout = DataLayout(data_dir)
    if not layout.db_path.is_file():
        return Health(False, f"no farmhost database in {data_dir}; run `farmhost init --data-dir {data_dir}`")
    pid = lock_holder(layout.lock_path)
    if pid is None:
        return Health(False, f"no farmhost daemon holds {layout.lock_path}; start `farmhost run`")
    try:
        folders = registered_folders(layout.db_path)
    except sqlite3.Error as err:
        return Health(False, f"daemon pid {pid} runs, but the group registry cannot be read: {err}")
    if not folders:
        return Health(True, f"daemon pid {pid} is running; no group is registered yet, so no heartbeat to check")
    moment = now or datetime.now(UTC)
    beats = [beat for folder in folders if (beat := _heartbeat(layout.ipc / folder / HOST_STATUS, folder, moment))]
    if not beats:
        return Health(False, f"daemon pid {pid} holds the lock but has written no heartbeat for {', '.join(folders)}")
    age, folder, status = min(beats)
    if status != "alive":
        return Health(False, f"the newest heartbeat ({folder}, {age:.1f} s old) says {status!r}")
    if age > max_age:
        return Health(False, f"daemon pid {pid}: newest heartbeat ({folder}) is {age:.1f} s old (limit {max_age:g} s)")
    return Health(True, f"daemon pid {pid} is running; heartbeat {age:.1f} s old ({folder})")


def lock_holder(lock_path: Path) -> int | None:
    """The pid of the process holding the daemon's flock on `lock_path`, from `/proc/locks`; None if nobody does.

    The daemon writes its pid into the file after taking the lock; the lock is real when `/proc/locks` lists a
    FLOCK on the file's inode held by that pid.
    """
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        inode = os.fstat(fd).st_ino
        written = os.read(fd, 32)
    finally:
        os.close(fd)  # flock belongs to the daemon's open file description: closing ours leaves it alone
    try:
        pid = int(written.strip())
    except ValueError:
        return None
    try:
        table = PROC_LOCKS.read_text()
    except OSError:
        return None
    for line in table.splitlines():
        # "3: FLOCK  ADVISORY  WRITE 1234 fd:01:131090 0 EOF"; waiters carry "->" after the number.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        if fields[4] == str(pid) and fields[5].rsplit(":", 1)[-1] == str(inode):
            return pid
    return None


def registered_folders(db_path: Path) -> list[str]:
    """The folders of the registered groups, read without writing anything."""
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        return groups.folders(conn)
    finally:
        conn.close()


def _heartbeat(path: Path, folder: str, now: datetime) -> tuple[float, str, str] | None:
    """(age in seconds, folder, status) of one `host_status.json`, or None when it is missing or unreadable."""
    try:
        document = json.loads(path.read_bytes())
        beat = datetime.fromisoformat(document["heartbeatAt"])
        status = str(document["status"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return max(0.0, (now - beat).total_seconds()), folder, status
