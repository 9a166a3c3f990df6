"""`farmhost ipc send`: write a request exactly as an agent does and print the result."""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from farmagent.errors import HostUnavailableError, InvalidRequestError, NoResultError, ProtocolError
from farmagent.ipc.core import IpcCore

from farmhost.cli.commands import open_existing
from farmhost.config import Settings
from farmhost.errors import InvalidRequest
from farmhost.layout import DataLayout
from farmhost.protocol.codes import HOST_STATUS, Queue
from farmhost.store import groups
from farmhost.terminal import json_for_terminal

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
    p.add_argument("--timeout", type=_seconds, default=40.0, help="seconds to wait for the result (default 40)")
    p.set_defaults(func=send)


def _seconds(text: str) -> float:
    """A wait in seconds: a finite number above 0 (nan, inf, 0 and negatives would never or at once give up)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, e.g. 40 (got {text!r})")
    return value


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
    if "requestId" in payload and not isinstance(payload["requestId"], str):
        raise InvalidRequest(f"requestId {payload['requestId']!r} is not valid: it must be text")
    db = open_existing(settings)
    try:
        if groups.get_group(db.conn, args.group) is None:
            raise InvalidRequest(f"no group with folder {args.group!r}; see `farmhost group list`")
    finally:
        db.close()
    group_ipc = DataLayout(settings.data_dir).group_ipc(args.group)
    # The agent's own client writes and waits: what this command proves is what an agent gets.
    core = IpcCore(group_ipc, timeout=args.timeout)
    try:
        request_id = core.write(args.queue, payload)
    except (InvalidRequestError, HostUnavailableError) as err:
        raise InvalidRequest(err.message) from None
    try:
        result = core.wait(request_id, queue=args.queue)
    except NoResultError as err:
        print(f"farmhost: no result for {request_id} within {args.timeout:g} s", file=sys.stderr)
        print(f"farmhost: {_fate(err.withdrawn, group_ipc)}", file=sys.stderr)
        print(f"farmhost: {_daemon_state(group_ipc / HOST_STATUS, settings)}", file=sys.stderr)
        return EXIT_NO_RESULT
    except (HostUnavailableError, ProtocolError) as err:
        print(f"farmhost: {err.message}", file=sys.stderr)
        print(f"farmhost: {_daemon_state(group_ipc / HOST_STATUS, settings)}", file=sys.stderr)
        return EXIT_NO_RESULT
    print(json_for_terminal(result.to_dict(), indent=2))
    return EXIT_SUCCESS if result.ok else EXIT_ERROR


def _fate(withdrawn: bool, group_ipc: Path) -> str:
    if withdrawn:
        return "the request was withdrawn and will not be executed"
    return f"the daemon picked the request up; its result will appear in {group_ipc}/action_results/"


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
