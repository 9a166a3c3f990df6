"""`farmhost ipc send`: write a request exactly as an agent does and print the result."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from farmhost.config import Settings
from farmhost.errors import InvalidRequest
from farmhost.ipc.client import wait_result, write_request
from farmhost.layout import DataLayout
from farmhost.protocol.codes import Queue
from farmhost.store import groups
from farmhost.store.db import Database

EXIT_SUCCESS, EXIT_ERROR, EXIT_NO_RESULT = 0, 1, 2


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `ipc send`."""
    ipc = sub.add_parser("ipc", help="talk to the daemon the way an agent does")
    cmds = ipc.add_subparsers(dest="ipc_command", required=True)
    p = cmds.add_parser(
        "send",
        parents=[common],
        help="write a request into a group's queue and print its result",
        description="Exit status: 0 the result says success, 1 it says error, 2 no result came in time.",
    )
    p.add_argument("--group", required=True, help="the source group's folder (identity comes from the directory)")
    p.add_argument("--queue", required=True, choices=[q.value for q in Queue])
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
    db = Database.open(settings.data_dir)
    try:
        if groups.get_group(db.conn, args.group) is None:
            raise InvalidRequest(f"no group with folder {args.group!r}; see `farmhost group list`")
    finally:
        db.close()
    layout = DataLayout(settings.data_dir)
    try:
        request_id = write_request(layout.group_ipc(args.group) / args.queue, payload)
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    result = wait_result(layout.group_ipc(args.group), request_id, timeout=args.timeout)
    if result is None:
        print(
            f"farmhost: no result for {request_id} within {args.timeout:g} s; is `farmhost run` running on "
            f"{settings.data_dir}? (see ipc/{args.group}/host_status.json)",
            file=sys.stderr,
        )
        return EXIT_NO_RESULT
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return EXIT_SUCCESS if result.get("status") == "success" else EXIT_ERROR
