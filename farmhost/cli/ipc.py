"""`farmhost ipc send`: write a request exactly as an agent does and print the result."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farmhost.cli.commands import open_existing
from farmhost.config import Settings
from farmhost.errors import InvalidRequest
from farmhost.ipc.client import wait_result, write_request
from farmhost.layout import DataLayout
from farmhost.protocol.codes import HOST_STATUS, Queue
from farmhost.store import groups

EXIT_SUCCESS, EXIT_ERROR, EXIT_NO_RESULT = 0, 1, 2
# A heartbeat older than this many intervals means the daemon that wrote it is gone (kill -9, power loss).
STALE_HEARTBEATS = 3


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `ipc send`."""
    ipc = sub.add_parser(
        "ipc",
        help="talk to the daemon the way an agent does",
        description="Talk to the running daemon through a group's IPC directory, exactly as an agent does.",
    )
    cmds = ipc.add_subparsers(dest="ipc_command", required=True)
    p = cmds.add_parser(
        "send",
        parents=[common],
        help="write a request into a group's queue and print its result",
        description="Write a request into ipc/<group>/<queue>/ (temp file + rename, as an agent does), wait for "
        "action_results/<requestId>.json and print it. Without a requestId one is generated. "
        "Exit status: 0 the result says success, 1 it says error, 2 no result came in time "
        "(the request is then withdrawn if the daemon had not picked it up yet).",
    )
    p.add_argument("--group", required=True, help="the source group's folder (identity comes from the directory)")
    p.add_argument("--queue", required=True, choices=[q.value for q in Queue], help="the queue directory to write into")
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument("--json", dest="payload", help="the request as a JSON object")
    body.add_argument("--file", type=argparse.FileType("r"), help="a file holding the request ('-' for stdin)")
    p.add_argument("--timeout", type=float, default=40.0, help="seconds to wait for the result (default 40)")
    p.set_defaults(func=send)


def send(args: argparse.Namespace, settings: Settings) -> int:
    """Write the request, wait, print the result JSON."""
    text = args.payload if args.payload is not None else args.file.read()
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequest(f"the request is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request must be a JSON object")
    if payload.get("requestId", "") is None:  # null means "no id", as it does for the daemon
        del payload["requestId"]
    db = open_existing(settings)
    try:
        if groups.get_group(db.conn, args.group) is None:
            raise InvalidRequest(f"no group with folder {args.group!r}; see `farmhost group list`")
    finally:
        db.close()
    group_ipc = DataLayout(settings.data_dir).group_ipc(args.group)
    try:
        request_id = write_request(group_ipc / args.queue, payload)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    result = wait_result(group_ipc, request_id, timeout=args.timeout)
    if result is None:
        print(f"farmhost: no result for {request_id} within {args.timeout:g} s", file=sys.stderr)
        print(f"farmhost: {_withdraw(group_ipc / args.queue / f'{request_id}.json')}", file=sys.stderr)
        print(f"farmhost: {_daemon_state(group_ipc / HOST_STATUS, settings)}", file=sys.stderr)
        return EXIT_NO_RESULT
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return EXIT_SUCCESS if result.get("status") == "success" else EXIT_ERROR


def _withdraw(request_file: Path) -> str:
    # The daemon claims a request by renaming it away, so the unlink either wins (never executed) or finds nothing.
    try:
        request_file.unlink()
    except FileNotFoundError:
        return (
            f"the daemon picked the request up; its result will appear in {request_file.parent.parent}/action_results/"
        )
    return "the request was withdrawn and will not be executed"


def _daemon_state(status_file: Path, settings: Settings) -> str:
    start = f"start it with `farmhost run --data-dir {settings.data_dir}`"
    try:
        status = json.loads(status_file.read_bytes())
        beat = datetime.fromisoformat(status["heartbeatAt"])
    except (OSError, ValueError, TypeError, KeyError):
        return f"no daemon has served this group yet; {start}"
    age = (datetime.now(UTC) - beat).total_seconds()
    if status.get("status") != "alive" or age > STALE_HEARTBEATS * settings.heartbeat_seconds:
        return f"the daemon is not running (last heartbeat {status['heartbeatAt']}); {start}"
    return f"the daemon (pid {status.get('pid')}) is running but did not answer in time; try a longer --timeout"
