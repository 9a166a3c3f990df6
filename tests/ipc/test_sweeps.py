"""Housekeeping at start-up: old results, the host's abandoned temp files and old quarantine go; the rest stays."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from farmhost_testing import Daemon, drop, wait_result


def _age(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_start_up_sweep_removes_only_what_is_old_and_ours(data_dir: Path) -> None:
    ipc = data_dir / "ipc" / "field"
    errors = data_dir / "ipc" / "errors" / "field"
    errors.mkdir(parents=True)
    old_result = ipc / "action_results" / "r-old.json"
    old_result.write_text("{}")
    _age(old_result, 25 * 3600)
    fresh_result = ipc / "action_results" / "r-fresh.json"
    fresh_result.write_text("{}")
    host_temp = ipc / ".host_status.json.deadbeef.tmp"
    host_temp.write_text("{")
    _age(host_temp, 2 * 3600)
    # An agent's file that only looks like the host's: the name goes on past ".tmp" (a newline).
    lookalike = ipc / ".host_status.json.deadbeef.tmp\n"
    lookalike.write_text("{")
    _age(lookalike, 2 * 3600)
    agent_temp = ipc / "actions" / ".a-1.json.tmp"
    agent_temp.write_text("{")
    _age(agent_temp, 2 * 3600)
    old_quarantine = errors / "20200101T000000.000000Z-actions-x.json"
    old_quarantine.write_text("x")
    _age(old_quarantine, 31 * 86400)
    recent_quarantine = errors / "20261101T000000.000000Z-actions-y.json"
    recent_quarantine.write_text("y")

    daemon = Daemon(data_dir).start()
    try:
        # The sweep runs before the daemon reports alive; a ping proves it is serving afterwards.
        assert (
            wait_result(data_dir, "field", drop(data_dir, "field", "actions", {"type": "ping"}))["status"] == "success"
        )
    finally:
        assert daemon.stop() == 0
    assert not old_result.exists()
    assert not host_temp.exists()
    assert not old_quarantine.exists()
    assert fresh_result.exists()
    assert agent_temp.exists(), "an agent's own temp file in its queue is never touched"
    assert lookalike.exists(), "only the host's own temp names are swept"
    assert recent_quarantine.exists()
    assert "swept 1 uncollected results, 1 abandoned temp files, 1 old quarantined files" in daemon.log()


def test_start_up_sweep_removes_old_quarantined_links_fifos_sockets_and_directories(data_dir: Path) -> None:
    errors = data_dir / "ipc" / "errors" / "field"
    errors.mkdir(parents=True)
    outside = data_dir.parent / "outside.txt"
    outside.write_text("must survive")
    (outside_dir := data_dir.parent / "outside-dir").mkdir()
    (outside_dir / "keep.txt").write_text("must survive")
    stamp = "20200101T000000.000000Z-actions-"
    link = errors / f"{stamp}link.json"
    link.symlink_to(outside)
    fifo = errors / f"{stamp}fifo.json"
    os.mkfifo(fifo)
    sock_path = errors / f"{stamp}sock.json"
    # A socket path must fit in 108 bytes: bound through the directory's descriptor, on the data dir's file system.
    errors_fd = os.open(errors, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(f"/proc/self/fd/{errors_fd}/{sock_path.name}")
    finally:
        os.close(errors_fd)
    tree = errors / f"{stamp}dir.json"
    deep = tree
    for level in range(200):  # deeper than anyone would recurse for, by descriptor all the way
        deep = deep / f"d{level}"
    deep.mkdir(parents=True)
    (deep / "x.json").write_text("{}")
    (deep / "escape").symlink_to(outside_dir)
    (tree / "fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(tree / "fifo")
    for entry in (link, fifo, sock_path, tree):
        then = time.time() - 31 * 86400
        os.utime(entry, (then, then), follow_symlinks=False)
    recent = errors / "20261101T000000.000000Z-actions-recent.json"
    recent.mkdir()

    daemon = Daemon(data_dir).start()
    try:
        assert (
            wait_result(data_dir, "field", drop(data_dir, "field", "actions", {"type": "ping"}))["status"] == "success"
        )
    finally:
        assert daemon.stop() == 0
    for entry in (link, fifo, sock_path, tree):
        assert not os.path.lexists(entry), entry
    assert recent.is_dir(), "a recent quarantined directory stays"
    assert outside.read_text() == "must survive" and (outside_dir / "keep.txt").read_text() == "must survive"
    assert "4 old quarantined files" in daemon.log()
