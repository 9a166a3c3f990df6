"""The `farmhost` command line: argument parsing and exit codes; the work is done by the services."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from farmhost import __version__
from farmhost.addon.options import OPTIONS_PATH
from farmhost.cli import commands, groups, health, ipc
from farmhost.config import Settings, load_settings
from farmhost.demo import cli as demo
from farmhost.errors import FarmhostError
from farmhost.logs import LOG_FORMATS

EPILOG = """\
Configuration comes from environment variables and an optional .env file in the current directory
(FARMHOST_DATA_DIR, TZ, HA_URL, HA_TOKEN, TELEGRAM_BOT_TOKEN, ...; see docs/configuration.md).
--data-dir always overrides FARMHOST_DATA_DIR. Every command is safe to run while the daemon runs.
"""


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    common = argparse.ArgumentParser(add_help=False)
    data_dir_help = "data directory (overrides FARMHOST_DATA_DIR; default ./data)"
    # SUPPRESS: a command without --data-dir must not reset one given before the command name.
    common.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS, help=data_dir_help)
    parser = argparse.ArgumentParser(
        prog="farmhost",
        description="farmhost: the host daemon of a farm-agent appliance next to Home Assistant.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"farmhost {__version__}")
    parser.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "init",
        parents=[common],
        help="create the data directory layout and database",
        description="Create the data directory (ipc/, ipc/errors/, groups/, farm-state/, logs/) and farmhost.db. "
        "Safe to run again: nothing that exists is touched.",
    )
    p.set_defaults(func=commands.init)
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run the daemon in the foreground (SIGTERM/SIGINT stop it)",
        description="Run the daemon in the foreground: it serves every registered group's IPC directory. "
        "SIGTERM or SIGINT stop it cleanly (host_status.json then says stopped). "
        "Only one daemon may run on a data directory. Logs go to stderr, one line per event, tokens redacted.",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging (overrides FARMHOST_LOG_LEVEL, default INFO)"
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="text (default) or json: one JSON object per line with ts, level, logger, message and the event's "
        "ids (group, requestId, runId, taskId, ...); overrides FARMHOST_LOG_FORMAT",
    )
    p.set_defaults(func=commands.run)
    p = sub.add_parser(
        "doctor",
        parents=[common],
        help="check every part and say how to fix what is off or broken",
        description="Check every part of the appliance (Python, data dir, database, groups, disk, inotify, clock, "
        "time zone, Home Assistant, Telegram, LLM, sandbox, agent limits, farm profile) and print ok, warn, off or "
        "broken with the fix, one line each as soon as it is known. Network probes give up after 5 s. "
        "Exit status 1 when anything is broken.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_doctor)
    p = sub.add_parser(
        "schema",
        parents=[common],
        help="print the JSON Schema of the IPC contract",
        description="Print the JSON Schema (draft 2020-12) of every request an agent may write and of the result "
        "the host writes back (committed as docs/schema/ipc-v1.schema.json).",
    )
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.add_argument(
        "--tools",
        action="store_true",
        help="print the sandbox's tool table instead (shipped as container/farmagent/tool_table.json)",
    )
    p.set_defaults(func=commands.schema)

    p = sub.add_parser(
        "addon-run",
        help="the Home Assistant add-on's entry point: options, Supervisor, then `farmhost run`",
        description="Read the add-on's /data/options.json (one warning per missing or wrong option), find Home "
        "Assistant and the MQTT broker through the Supervisor (SUPERVISOR_TOKEN; FARMHOST_SUPERVISOR_URL, default "
        "http://supervisor), create /data/farmhost and the main chat's group, then exec `farmhost run` as uid 1000.",
    )
    p.add_argument("--options", type=Path, default=OPTIONS_PATH, help="the options file (default /data/options.json)")
    p.set_defaults(func=_addon_run)

    groups.add_parsers(sub, common)
    commands.add_list_parsers(sub, common)
    ipc.add_parsers(sub, common)
    health.add_parsers(sub, common)
    demo.add_parser(sub)
    return parser


# The doctor's checks and the add-on's start import the sandbox, the farm policy and the Supervisor client: only
# these commands load them, so `farmhost health` (a container's HEALTHCHECK, every 30 s) and the others start faster.
def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from farmhost.cli.doctor import doctor

    return doctor(args, settings)


def _addon_run(args: argparse.Namespace, _settings: Settings) -> int:
    from farmhost.addon.run import addon_run

    return addon_run(args.options)


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
    except BrokenPipeError:  # `farmhost group list | head`: the reader left, which is not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:
        if err.filename is None:  # not about a path the operator gave: a bug or the system's, its traceback helps
            raise
        print(f"farmhost: error: {path_error(err)}", file=sys.stderr)
        return 2
    return code


# What to do about a path, by what is wrong with it; the operator gave the path (--data-dir, -o, a variable).
_PATH_ADVICE: Final[dict[type[OSError], str]] = {
    NotADirectoryError: "a part of it is not a directory; give a directory path",
    FileNotFoundError: "it or its directory does not exist; create the directory or give another path",
    IsADirectoryError: "is a directory; give a file name",
    PermissionError: "permission denied; fix its permissions or give another path",
    FileExistsError: "something else is in the way; move it or give another path",
}


def path_error(err: OSError) -> str:
    """One line for an OSError about a path: the path, what is wrong with it and what to do."""
    advice = _PATH_ADVICE.get(type(err)) or f"{err.strerror or err}; check the path or give another one"
    return f"{err.filename}: {advice}"
