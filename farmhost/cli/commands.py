"""Small commands: init, run, schema, task list, outbox list."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from farmhost.config import Settings
from farmhost.errors import ConfigError
from farmhost.layout import DataLayout
from farmhost.logs import configure
from farmhost.protocol.schema import contract_schema
from farmhost.store import outbox, tasks
from farmhost.store.db import Database, iso


def open_existing(settings: Settings) -> Database:
    """Open the database for a command that only uses it; a missing one is refused, never created.

    Raises:
        ConfigError: the data directory has no database (a typo in --data-dir, or `init` not run yet).
    """
    if not DataLayout(settings.data_dir).db_path.is_file():
        root = settings.data_dir
        raise ConfigError(f"no farmhost database in {root}; create it with `farmhost init --data-dir {root}`")
    return Database.open(settings.data_dir)


def init(args: argparse.Namespace, settings: Settings) -> int:
    """Create the data directory layout and the database."""
    DataLayout(settings.data_dir).create()
    Database.open(settings.data_dir).close()
    print(f"data directory ready: {settings.data_dir}")
    print("next: farmhost group add --jid telegram:<chat id> --name <name> --folder main --main")
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the daemon until a signal stops it."""
    secrets = [s for s in (settings.ha_token, settings.telegram_bot_token, settings.llm_api_key) if s]
    configure("DEBUG" if args.verbose else settings.log_level, secrets=secrets)
    from farmhost.app import App  # the daemon's whole dependency tree; other commands start faster without it

    asyncio.run(App(settings).run())
    return 0


def schema(args: argparse.Namespace, settings: Settings) -> int:
    """Print or write the contract's JSON Schema."""
    text = json.dumps(contract_schema(), indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def add_list_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """`task list` and `outbox list`."""
    task = sub.add_parser(
        "task", help="scheduled tasks", description="Inspect the scheduled tasks agents created."
    ).add_subparsers(dest="task_command", required=True)
    p = task.add_parser(
        "list",
        parents=[common],
        help="list tasks (all groups)",
        description="List the scheduled tasks of every group with their schedule and next run.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--all", action="store_true", help="include cancelled tasks")
    p.set_defaults(func=task_list)
    box = sub.add_parser(
        "outbox", help="the durable outbox", description="Inspect the durable outbox of Telegram messages."
    ).add_subparsers(dest="outbox_command", required=True)
    p = box.add_parser(
        "list",
        parents=[common],
        help="list outbox entries, oldest first",
        description="List outbox entries (one per message chunk or file), oldest first, with their delivery status.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--status", choices=["pending", "sent", "failed"], help="only entries with this status")
    p.add_argument("--limit", type=int, default=200, help="at most this many entries (default 200)")
    p.set_defaults(func=outbox_list)


def task_list(args: argparse.Namespace, settings: Settings) -> int:
    """Print the tasks table."""
    db = open_existing(settings)
    try:
        rows = tasks.list_tasks(db.conn, include_cancelled=args.all)
    finally:
        db.close()
    if args.json:
        print(json.dumps([t.to_snapshot() for t in rows], indent=2))
        return 0
    if not rows:
        print("no tasks")
        return 0
    print(f"{'ID':<34} {'GROUP':<16} {'STATUS':<10} {'SCHEDULE':<28} {'NEXT RUN':<29} PROMPT")
    for t in rows:
        schedule = f"{t.schedule_type} {t.schedule_value}"
        print(
            f"{t.id:<34} {t.group_folder:<16} {t.status:<10} {schedule:<28} {iso(t.next_run) or '-':<29} "
            f"{_short(t.prompt)}"
        )
    return 0


def outbox_list(args: argparse.Namespace, settings: Settings) -> int:
    """Print the outbox."""
    db = open_existing(settings)
    try:
        rows = outbox.list_entries(db.conn, status=args.status, limit=args.limit)
    finally:
        db.close()
    if args.json:
        print(json.dumps([e.to_dict() for e in rows], indent=2, ensure_ascii=False))
        return 0
    if not rows:
        print("outbox is empty")
        return 0
    print(f"{'ID':>6} {'STATUS':<8} {'TRIES':>5} {'CHUNK':<6} {'CHAT':<24} {'FROM':<14} TEXT")
    for e in rows:
        text = _short(e.body or "") if e.kind == "text" else f"[file {e.file_path}] {_short(e.body or '')}"
        print(
            f"{e.id:>6} {e.status:<8} {e.attempts:>5} {e.chunk_index + 1}/{e.chunk_count:<4} {e.chat_jid:<24} "
            f"{e.source_folder or '-':<14} {text}"
        )
        if e.last_error:
            print(f"{'':>6} last error: {e.last_error}")
    return 0


def _short(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
