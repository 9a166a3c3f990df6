"""Host -> agent snapshots: `current_tasks.json`, `available_groups.json` and the `host_status.json` heartbeat."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from farmhost.files import write_json_atomic
from farmhost.protocol.envelope import utc_stamp
from farmhost.store import chats, tasks
from farmhost.store.db import Database, iso
from farmhost.store.groups import Group

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class HostIdentity:
    """What `host_status.json` says about the running daemon."""

    pid: int
    version: str
    started_at: datetime


def tasks_snapshots(db: Database, targets: Iterable[Group]) -> dict[str, list[dict[str, Any]]]:
    """`current_tasks.json` of each group, by folder, from one read: main sees every task, others their own."""
    every: list[dict[str, Any]] = []
    by_folder: dict[str, list[dict[str, Any]]] = {}
    for task in tasks.list_tasks(db.conn):
        document = task.to_snapshot()
        every.append(document)
        by_folder.setdefault(task.group_folder, []).append(document)
    return {group.folder: every if group.is_main else by_folder.get(group.folder, []) for group in targets}


def groups_snapshot(db: Database, group: Group, registered: list[Group], *, now: datetime) -> dict[str, Any]:
    """`available_groups.json`: every known chat for main, an empty list for everyone else."""
    if not group.is_main:
        return {"groups": [], "lastSync": utc_stamp(now)}
    by_jid = {g.jid: g for g in registered}
    entries: dict[str, dict[str, Any]] = {}
    for chat in chats.list_chats(db.conn):
        bound = by_jid.get(chat.jid)
        entries[chat.jid] = {
            "jid": chat.jid,
            "name": bound.name if bound else chat.name,
            "folder": bound.folder if bound else None,
            "isRegistered": bound is not None,
            "lastActivity": iso(chat.last_activity),
        }
    for g in registered:
        entries.setdefault(
            g.jid, {"jid": g.jid, "name": g.name, "folder": g.folder, "isRegistered": True, "lastActivity": None}
        )
    return {"groups": sorted(entries.values(), key=lambda e: e["jid"]), "lastSync": utc_stamp(now)}


def host_status(identity: HostIdentity, *, status: str, now: datetime) -> dict[str, Any]:
    """`host_status.json`: alive or stopped, with a heartbeat a client can age."""
    return {
        "status": status,
        "pid": identity.pid,
        "version": identity.version,
        "startedAt": utc_stamp(identity.started_at),
        "heartbeatAt": utc_stamp(now),
    }


def write_snapshot(
    group_fd: int,
    name: str,
    document: Any,
    *,
    evict: Callable[[int, str, os.stat_result, str], bool],
    durable: bool = True,
) -> bool:
    """Write one snapshot atomically into a group's IPC directory (by descriptor).

    An agent that put a directory where the snapshot goes has it moved to quarantine and the write retried.
    Returns whether the snapshot was written (the caller logs a failure once). `durable=False` skips the fsync
    (see `write_atomic`).
    """
    for _ in range(2):
        try:
            write_json_atomic(group_fd, name, document, durable=durable)
            return True
        except IsADirectoryError:
            try:
                seen = os.stat(name, dir_fd=group_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not evict(group_fd, name, seen, f"{name} was replaced by a directory; the host moved it away"):
                return False
        except OSError as err:
            logger.debug("could not write %s: %s", name, os.strerror(err.errno or 0))
            return False
    return False
