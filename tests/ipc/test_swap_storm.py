"""A group that swaps its own queue directory for a link to main's, in a tight loop, while main works.

The attack of issue 12: `actions/` renamed away, `actions -> ../main/actions` planted, removed, the real
directory put back, thousands of times. Nothing of main's may ever appear in the attacker's tree or quarantine,
main must be answered throughout, and the attacker's own requests (written into its real directory, wherever it
is at the moment) must all be answered once the storm ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from farmhost_testing import Daemon, drop, read_result, scaled, wait_for, wait_result
from ipc_support import Env, make_data_dir, ping_ok, uid, write_raw

STORM_SECONDS = 5.0


@pytest.fixture
def storm_env(tmp_path: Path) -> Iterator[Env]:
    data_dir = make_data_dir(tmp_path / "data")
    (data_dir / "groups" / "main" / "MEMORY.md").write_text("main-only knowledge: the safe code is zebra-quartz\n")
    daemon = Daemon(data_dir).start()
    yield Env(data_dir=data_dir, daemon=daemon)
    assert daemon.stop() == 0, daemon.log()
    assert "Traceback" not in daemon.log(), daemon.log()


# The attacking agent, in its own process (as an agent is): for `seconds` it swaps `field/actions` for a link to
# main's queue and back, now and then writing a batch of its own requests into its real directory, wherever that
# is at the moment; then it puts its requests where its client expects them and prints what it did.
_STORM = r"""
import contextlib, json, os, secrets, sys, time
group, seconds = sys.argv[1], float(sys.argv[2])
actions, parked = os.path.join(group, "actions"), os.path.join(group, "actions.real")
rounds, own = 0, []

def write_own(real):
    if rounds % 50:
        return
    for _ in range(20):
        rid = "field-own-" + secrets.token_hex(5)
        tmp = os.path.join(real, "." + rid + ".tmp")
        try:
            with open(tmp, "w") as f:
                f.write(json.dumps({"type": "ping", "requestId": rid}))
            os.rename(tmp, os.path.join(real, rid + ".json"))
        except OSError:
            return
        own.append(rid)

def settle():
    # Put the real directory back at `actions`, whatever the host did meanwhile (it recreates what is missing).
    if not os.path.isdir(parked):
        return
    if os.path.islink(actions):
        os.unlink(actions)
    if os.path.isdir(actions):
        for name in os.listdir(actions):
            os.rename(os.path.join(actions, name), os.path.join(parked, name))
        os.rmdir(actions)
    os.rename(parked, actions)

end = time.monotonic() + seconds
while time.monotonic() < end:
    with contextlib.suppress(OSError):
        settle()
        os.rename(actions, parked)
        write_own(parked)
        os.symlink("../main/actions", actions)
        time.sleep((rounds % 7) / 1000)  # pacing: links that live 0-6 ms, long enough for the host to act
        os.unlink(actions)
        os.rename(parked, actions)
        write_own(actions)
    rounds += 1
for _ in range(100):
    with contextlib.suppress(OSError):
        settle()
        break
print(json.dumps({"rounds": rounds, "own": own}))
"""


def _moved(src: Path, dst: Path) -> bool:
    """Rename `src` to `dst` if `src` is there now."""
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return False
    return True


def _clear(path: Path) -> None:
    """Remove the planted link, or the empty directory the host recreated in its place.

    The host acts meanwhile: what was a link when looked at may be its recreated directory a moment later.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        with contextlib.suppress(OSError):  # something is in it: the rename that follows replaces it or fails
            path.rmdir()


def _every_file(root: Path) -> Iterator[Path]:
    for current, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(current, name)


def test_swap_storm_never_crosses_groups_and_loses_nothing(storm_env: Env) -> None:
    data_dir = storm_env.data_dir
    storm = subprocess.Popen(
        [sys.executable, "-c", _STORM, str(data_dir / "ipc" / "field"), str(STORM_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    main_ids: list[str] = []
    try:
        while storm.poll() is None:
            batch = [uid("main-work") for _ in range(20)]
            search = {"query": "safe code", "topK": 3}
            for rid in batch:
                request = {"type": "memory_action", "action": "memory_search", "requestId": rid, "params": search}
                drop(data_dir, "main", "actions", request)
            for rid in batch:
                result = wait_result(data_dir, "main", rid, timeout=scaled(10))
                assert result["status"] == "success", result
                assert "zebra-quartz" in json.dumps(result), result
            main_ids.extend(batch)
    finally:
        out, _ = storm.communicate(timeout=scaled(30))
    assert storm.returncode == 0
    attack = json.loads(out)
    assert attack["rounds"] > 100, f"the storm ran only {attack['rounds']} rounds"
    assert len(main_ids) >= 5, main_ids

    # The attacker's queue works again, and every request it wrote into its real directory was answered.
    ping_ok(data_dir, "field")
    for rid in attack["own"]:
        assert wait_result(data_dir, "field", rid, timeout=scaled(20))["status"] == "success", rid

    # Nothing of main's anywhere in field's IPC tree, its workspace or its quarantine.
    field_trees = [data_dir / "ipc" / "field", data_dir / "groups" / "field", data_dir / "ipc" / "errors" / "field"]
    for root in field_trees:
        for path in _every_file(root):
            assert "main-work" not in path.name, f"{path}: main's result in field's tree"
            if path.is_file() and not path.is_symlink():
                content = path.read_bytes()
                assert b"main-work" not in content and b"zebra-quartz" not in content, f"{path}: main's data"
    for rid in main_ids:
        assert read_result(data_dir, "field", rid) is None
    # Every quarantined entry of field is one of its planted links, never a real directory with requests in it.
    errors = data_dir / "ipc" / "errors" / "field"
    if errors.is_dir():
        for path in errors.iterdir():
            if not path.name.endswith(".reason.json"):
                assert path.is_symlink(), f"{path} is not a planted link"
    log = storm_env.daemon.log()
    assert "EBADF" not in log and "Bad file descriptor" not in log, log[-3000:]
    # The swapping costs the host a bounded amount of work (before the pacing: ~900 evictions in 5 s), and the
    # operator is told once that this group is being paced.
    assert "group field replaced its IPC directories 8 times within 10 s" in log, log[-3000:]
    evictions = log.count("group field: actions/ was a symlink; moved it to quarantine")
    assert 1 <= evictions < 100, f"{evictions} evictions for {attack['rounds']} swaps"
    ping_ok(data_dir, "main")


def test_an_evicted_link_is_only_what_was_seen(storm_env: Env) -> None:
    """The host saw a link; by the time it moves it, the real directory (with requests) is back: it stays."""
    data_dir = storm_env.data_dir
    actions = data_dir / "ipc" / "field" / "actions"
    pending = []
    for _ in range(200):
        rid = uid("kept")
        # While the host puts back a directory it caught by mistake, `actions` is briefly away: the agent waits.
        wait_for(lambda: _moved(actions, actions.with_name("actions.real")), timeout=scaled(10), what="actions/ back")
        write_raw(actions.with_name("actions.real"), f"{rid}.json", json.dumps({"type": "ping"}).encode())
        pending.append(rid)
        with contextlib.suppress(FileExistsError):
            os.symlink(f"../main/actions-{secrets.token_hex(2)}", actions)
        _clear(actions)
        os.rename(actions.with_name("actions.real"), actions)
    for rid in pending:
        assert wait_result(data_dir, "field", rid, timeout=scaled(20))["status"] == "success", rid
    ping_ok(data_dir, "field")
