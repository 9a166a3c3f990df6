"""`farmhost ipc send`: exit 0 success, 1 error result, 2 no result; input refused before anything is written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from farmhost_testing import Daemon, farmhost

RESULT_KEYS = {"requestId", "type", "action", "status", "result", "error", "errorCode", "executedAt", "durationMs"}


def _send(data_dir: Path, group: str, queue: str, *body: str, timeout: float = 10, stdin: str | None = None) -> Any:
    args = ("ipc", "send", f"--group={group}", f"--queue={queue}", *body, f"--timeout={timeout}")
    return farmhost(*args, data_dir=data_dir, input=stdin)


def _result(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    result = json.loads(done.stdout)
    assert isinstance(result, dict) and set(result) == RESULT_KEYS, done.stdout
    return result


def _queued(data_dir: Path, group: str, queue: str) -> list[str]:
    return sorted(p.name for p in (data_dir / "ipc" / group / queue).iterdir())


def test_send_without_a_daemon_and_bad_input(data_dir: Path, tmp_path: Path) -> None:
    done = _send(data_dir, "main", "actions", "--json", '{"type": "ping", "requestId": "lonely-1"}', timeout=0.5)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "lonely-1" in done.stderr and "0.5 s" in done.stderr
    assert "farmhost run" in done.stderr
    assert "withdrawn" in done.stderr
    assert "Traceback" not in done.stderr
    # Withdrawn: a daemon started later will not execute a request whose sender has given up.
    assert _queued(data_dir, "main", "actions") == []

    # Bad input is refused before anything is written.
    table = [
        # (group, body, phrase of the one-line refusal)
        ("main", ("--json", '{"type": "ping"'), "not valid JSON"),
        ("main", ("--json", '["ping"]'), "must be a JSON object"),
        ("nope", ("--json", '{"type": "ping"}'), "no group with folder 'nope'"),
        ("main", ("--json", '{"type": "ping", "requestId": "../escape"}'), "is not valid"),
        ("main", ("--json", '{"type": "ping", "requestId": 7}'), "is not valid"),
        ("main", ("--file", str(tmp_path / "absent.json")), "absent.json"),
    ]
    for group, body, phrase in table:
        done = _send(data_dir, group, "actions", *body, timeout=0.5)
        assert done.returncode == 2, (body, done.stderr)
        assert phrase in done.stderr, (phrase, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
    assert _queued(data_dir, "main", "actions") == []
    assert not (data_dir / "ipc" / "nope").exists()
    assert not (data_dir / "ipc" / "main" / "escape.json").exists()


def test_send_through_a_running_daemon(daemon: Daemon, data_dir: Path, tmp_path: Path) -> None:
    ok = _send(data_dir, "field", "actions", "--json", '{"type": "ping"}')
    assert ok.returncode == 0, ok.stderr
    pong = _result(ok)
    assert pong["status"] == "success" and pong["result"]["pong"] is True
    assert pong["type"] == "ping" and pong["errorCode"] is None
    # The result was collected, like an agent does.
    assert _queued(data_dir, "field", "action_results") == []

    refused = _send(data_dir, "field", "actions", "--json", '{"type": "farm_action", "action": "ha_get_status"}')
    assert refused.returncode == 1, refused.stderr
    error = _result(refused)
    assert error["status"] == "error" and error["errorCode"] == "unauthorized"
    assert error["action"] == "ha_get_status" and "main" in error["error"]

    request = tmp_path / "ping.json"
    request.write_text('{"type": "ping", "requestId": "from-file-1"}')
    from_file = _send(data_dir, "main", "actions", "--file", str(request))
    assert from_file.returncode == 0, from_file.stderr
    assert _result(from_file)["requestId"] == "from-file-1"

    from_stdin = _send(data_dir, "main", "actions", "--file", "-", stdin='{"type": "ping", "requestId": "stdin-1"}')
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert _result(from_stdin)["requestId"] == "stdin-1"

    # A null requestId means "none": one is generated, as the daemon would.
    null_id = _send(data_dir, "main", "actions", "--json", '{"type": "ping", "requestId": null}')
    assert null_id.returncode == 0, null_id.stderr
    assert _result(null_id)["requestId"]

    # An invalid request is answered by the daemon (quarantined, error result): exit 1, not a hang.
    bad = _send(data_dir, "main", "tasks", "--json", '{"type": "schedule_task", "prompt": "x"}')
    assert bad.returncode == 1, bad.stderr
    assert _result(bad)["errorCode"] == "invalid_request"

    # A group added while the daemon runs is served; once removed it is refused by name.
    added = farmhost("group", "add", "--jid", "telegram:300", "--name", "Late", "--folder", "late", data_dir=data_dir)
    assert added.returncode == 0, added.stderr
    done = _send(data_dir, "late", "actions", "--json", '{"type": "ping"}')
    assert done.returncode == 0, done.stderr + daemon.log()
    assert _result(done)["status"] == "success"
    removed = farmhost("group", "remove", "late", data_dir=data_dir)
    assert removed.returncode == 0, removed.stderr
    # Once unregistered, the group is refused by name.
    gone = _send(data_dir, "late", "actions", "--json", '{"type": "ping"}', timeout=0.5)
    assert gone.returncode == 2
    assert "no group with folder 'late'" in gone.stderr
