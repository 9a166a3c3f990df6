"""Helpers of the IPC engine tests: ids, the request log, quarantine look-ups, data-dir trees, CLI reads."""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, drop, farmhost, init_data_dir, wait_for, wait_result

UNREGISTERED_JID = "telegram:999"
STAMP = r"\d{8}T\d{6}\.\d{6}Z"


@dataclass
class Env:
    """A data directory with `main` and `field`, and the daemon serving it."""

    data_dir: Path
    daemon: Daemon


make_data_dir = init_data_dir


def uid(prefix: str = "r") -> str:
    """A fresh valid requestId."""
    return f"{prefix}-{secrets.token_hex(5)}"


def ping_ok(data_dir: Path, folder: str) -> dict[str, Any]:
    """The daemon still answers a ping in `folder` (used after every attack)."""
    rid = uid("alive")
    drop(data_dir, folder, "actions", {"type": "ping", "requestId": rid})
    result = wait_result(data_dir, folder, rid)
    assert result["status"] == "success" and result["result"]["pong"] is True, result
    # The result is written before the spooled request is released: wait for that too, so callers that
    # compare directory listings afterwards see the finished state.
    spooled = data_dir / "ipc" / ".spool" / folder / "actions" / f"{rid}.json"
    wait_for(lambda: not spooled.exists(), timeout=10, what=f"{rid} released from the spool")
    return result


def request_log(data_dir: Path) -> list[dict[str, Any]]:
    """Every complete line of `logs/requests.ndjson`."""
    path = data_dir / "logs" / "requests.ndjson"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith("\n") and line.strip()]


def logged(data_dir: Path, **match: Any) -> list[dict[str, Any]]:
    """Request-log records whose fields equal `match`."""
    return [r for r in request_log(data_dir) if all(r.get(k) == v for k, v in match.items())]


def wait_logged(data_dir: Path, *, count: int = 1, timeout: float = 10.0, **match: Any) -> list[dict[str, Any]]:
    """Wait until at least `count` request-log records match, and return them."""
    return wait_for(
        lambda: (found := logged(data_dir, **match)) and len(found) >= count and found,
        timeout=timeout,
        what=f"{count} request-log record(s) {match}",
    )


def notes(data_dir: Path, folder: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every `.reason.json` of a group's quarantine with its path."""
    errors = data_dir / "ipc" / "errors" / folder
    if not errors.is_dir():
        return []
    found = []
    for path in sorted(errors.iterdir()):
        if path.name.endswith(".reason.json"):
            try:
                found.append((path, json.loads(path.read_bytes())))
            except json.JSONDecodeError:  # being written right now
                continue
    return found


def wait_quarantined(
    data_dir: Path, folder: str, file: str, *, queue: str = "actions", timeout: float = 10.0, reason: str = ""
) -> tuple[Path, dict[str, Any]]:
    """Wait for the quarantine note of `file` (with `reason` in it), check the layout; returns (entry, note)."""

    def find() -> tuple[Path, dict[str, Any]] | None:
        hits = [
            (p, n)
            for p, n in notes(data_dir, folder)
            if n.get("file") == file and n.get("queue") == queue and reason in n.get("reason", "")
        ]
        return hits[-1] if hits else None

    path, note = wait_for(find, timeout=timeout, what=f"quarantine note for {folder}/{queue}/{file}")
    entry = path.with_name(path.name[: -len(".reason.json")])
    assert re.fullmatch(rf"{STAMP}-{re.escape(queue)}-.+", entry.name), entry.name
    assert os.path.lexists(entry), f"quarantined entry {entry} is missing next to its note"
    assert set(note) == {"folder", "queue", "file", "reason", "errorCode", "receivedAt"}, note  # SPEC §4, exactly
    assert note["folder"] == folder
    assert isinstance(note["reason"], str) and note["reason"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", note["receivedAt"]), note
    return entry, note


def wait_note(
    data_dir: Path, folder: str, file: str, *, queue: str = "actions", timeout: float = 10.0, reason: str = ""
) -> dict[str, Any]:
    """`wait_quarantined`, returning only the note."""
    return wait_quarantined(data_dir, folder, file, queue=queue, timeout=timeout, reason=reason)[1]


def quarantined_entry(data_dir: Path, folder: str, queue: str, name: str) -> Path:
    """The quarantined entry (not its note) of `queue/name`; exactly one must exist."""
    errors = data_dir / "ipc" / "errors" / folder
    pattern = re.compile(rf"{STAMP}-{re.escape(queue)}-{re.escape(name)}(-\d+)?")
    hits = [p for p in errors.iterdir() if pattern.fullmatch(p.name)]
    assert len(hits) == 1, hits
    return hits[0]


def tree(root: Path) -> set[str]:
    """Every path under `root` (relative), without following symlinks."""
    found: set[str] = set()
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.relpath(os.path.join(current, name), root))
    return found


def tasks(data_dir: Path) -> list[dict[str, Any]]:
    """`farmhost task list --json --all`."""
    done = farmhost("task", "list", "--json", "--all", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def outbox(data_dir: Path) -> list[dict[str, Any]]:
    """`farmhost outbox list --json`."""
    done = farmhost("outbox", "list", "--json", "--limit", "100000", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def groups(data_dir: Path) -> dict[str, dict[str, Any]]:
    """`farmhost group list --json`, by folder."""
    done = farmhost("group", "list", "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return {g["folder"]: g for g in json.loads(done.stdout)}


def write_raw(queue_dir: Path, name: str, data: bytes) -> None:
    """Write bytes under `name` the way an agent does (dot-temp, then rename)."""
    tmp = queue_dir / f".{secrets.token_hex(4)}.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, queue_dir / name)
