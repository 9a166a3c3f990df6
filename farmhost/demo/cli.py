"""`farmhost demo`: its argument parser and the command (the work is in runner.py)."""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import os
import sys
from pathlib import Path
from typing import Any

from farmhost.config import Settings
from farmhost.demo.simulator import DEFAULT_START_HOUR, DEFAULT_TICK
from farmhost.demo.text import HELP_DESCRIPTION, HELP_EPILOG

DEFAULT_DATA_DIR = Path("demo-data")


def add_parser(sub: Any) -> None:
    """Register `farmhost demo`."""
    p = sub.add_parser(
        "demo",
        help="the local demo: a real Home Assistant farm, farmhost, a dashboard and a terminal chat",
        description=HELP_DESCRIPTION,
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"the demo's data directory (default ./{DEFAULT_DATA_DIR}; FARMHOST_DATA_DIR is not used, so the demo "
        "never takes over a real installation's data); Home Assistant lives in its ha/ subdirectory",
    )
    p.add_argument(
        "--port",
        type=_port,
        default=None,
        help="Home Assistant's port on 127.0.0.1 (default 8123, or any free port when 8123 is taken; 0 = any free)",
    )
    p.add_argument(
        "--tick",
        type=_positive,
        default=DEFAULT_TICK,
        help=f"real seconds per farm hour in the simulation (default {DEFAULT_TICK:g}: a farm day in 4 minutes)",
    )
    p.add_argument(
        "--start-hour",
        type=_hour,
        default=DEFAULT_START_HOUR,
        help=f"the farm's time of day when the simulation starts, 0-24 (default {DEFAULT_START_HOUR:g}; "
        "the night frost comes at about 01:00)",
    )
    p.add_argument("--no-chat", action="store_true", help="do not read stdin (the farm runs until Ctrl-C)")
    p.add_argument(
        "--exit-after-setup",
        action="store_true",
        help="stop cleanly as soon as everything is set up and printed (for CI); exit status 1 if the dashboard "
        "or the screenshot failed",
    )
    p.add_argument("--exit-on-eof", action="store_true", help="stop when stdin ends, after the last answer")
    p.add_argument(
        "--keep-ha",
        action="store_true",
        help="leave Home Assistant running when the demo stops; the next demo on this data dir reuses it",
    )
    p.add_argument("--no-screenshot", action="store_true", help="skip the dashboard screenshot (saves a few seconds)")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="farmhost's log lines from INFO on stderr (default: errors only; all of them are in "
        "<data-dir>/demo.log, DEBUG with -v)",
    )
    p.set_defaults(func=demo)


def demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run the demo until a signal (or as the flags say); the exit status."""
    from farmhost.demo.runner import Demo, DemoOptions  # the App's whole tree: only when the demo really runs

    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # a pipe (CI, tests) sees each line as it is printed
    data_dir = Path(os.path.abspath(args.data_dir or DEFAULT_DATA_DIR))
    options = DemoOptions(
        data_dir=data_dir,
        port=args.port,
        tick=args.tick,
        start_hour=args.start_hour,
        chat=not args.no_chat,
        exit_after_setup=args.exit_after_setup,
        exit_on_eof=args.exit_on_eof,
        keep_ha=args.keep_ha,
        screenshot=not args.no_screenshot,
        verbose=args.verbose,
    )
    return asyncio.run(Demo(options, settings).run())


def _positive(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _hour(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 24:
        raise argparse.ArgumentTypeError("must be an hour from 0 to 24")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a port number from 0 to 65535")
    return value
