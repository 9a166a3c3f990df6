"""The `farmhost` command line: argument parsing and exit codes; the work is done by the services."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from farmhost import __version__
from farmhost.cli import commands, doctor, groups, ipc
from farmhost.config import Settings, load_settings
from farmhost.errors import FarmhostError

EPILOG = """\
Configuration comes from environment variables and an optional .env file in the current directory
(FARMHOST_DATA_DIR, TZ, HA_URL, HA_TOKEN, TELEGRAM_BOT_TOKEN, ...; see docs/configuration.md).
--data-dir always overrides FARMHOST_DATA_DIR. Every command is safe to run while the daemon runs.
"""


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, help="data directory (overrides FARMHOST_DATA_DIR; default ./data)")
    parser = argparse.ArgumentParser(
        prog="farmhost",
        description="farmhost: the host daemon of a farm-agent appliance next to Home Assistant.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"farmhost {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("init", parents=[common], help="create the data directory layout and database")
    p.set_defaults(func=commands.init)
    p = sub.add_parser("run", parents=[common], help="run the daemon in the foreground (SIGTERM/SIGINT stop it)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=commands.run)
    p = sub.add_parser("doctor", parents=[common], help="check every part and say how to fix what is off or broken")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=doctor.doctor)
    p = sub.add_parser("schema", parents=[common], help="print the JSON Schema of the IPC contract")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(func=commands.schema)

    groups.add_parsers(sub, common)
    commands.add_list_parsers(sub, common)
    ipc.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        settings: Settings = load_settings(data_dir=args.data_dir)
        code: int = args.func(args, settings)
    except FarmhostError as err:
        print(f"farmhost: error: {err.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
