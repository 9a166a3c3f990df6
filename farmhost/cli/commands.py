"""Small commands: init, run, schema, task list, task runs, outbox list."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from farmhost.config import Settings
from farmhost.errors import ConfigError, NotFound
from farmhost.layout import DataLayout
from farmhost.logs import configure
from farmhost.store import outbox, task_runs, tasks
from farmhost.store.db import Database, iso
from farmhost.terminal import for_terminal, json_for_terminal


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
    log_format = args.log_format or settings.log_format
    configure("DEBUG" if args.verbose else settings.log_level, secrets=settings.secret_values(), log_format=log_format)
    from farmhost.app import App  # the daemon's whole dependency tree; other commands start faster without it

    asyncio.run(App(settings).run())
    return 0


def schema(args: argparse.Namespace, settings: Settings) -> int:
    """Print or write the contract's JSON Schema, or with `--tools` the sandbox's tool table."""
    from farmhost.protocol.schema import contract_schema, tool_table  # pydantic's schema machinery: only here

    document = tool_table() if args.tools else contract_schema()
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def add_list_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """`task list`, `task runs` and `outbox list`."""
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
    p = task.add_parser(
        "runs",
        parents=[common],
        help="show the runs of one task",
        description="Show the latest runs of a task, oldest first: due time, status (running, ok, error, timeout, "
        "interrupted, skipped), duration (from the claim to the end, queue wait included) and summary "
        "(the agent's answer or the error, or why a due time was skipped).",
    )
    p.add_argument("task_id", metavar="TASK_ID", help="the task's id (see `farmhost task list`)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--limit", type=int, default=50, help="at most this many runs, the latest (default 50)")
    p.set_defaults(func=task_runs_list)
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
        last = task_runs.last_statuses(db.conn)
    finally:
        db.close()
    if args.json:
        print(json_for_terminal([{**t.to_snapshot(), "lastRunStatus": last.get(t.id)} for t in rows], indent=2))
        return 0
    if not rows:
        print("no tasks")
        return 0
    print(f"{'ID':<34} {'GROUP':<16} {'STATUS':<10} {'SCHEDULE':<28} {'NEXT RUN':<29} {'LAST RUN':<11} PROMPT")
    for t in rows:
        schedule = f"{t.schedule_type} {t.schedule_value}"
        waiting = "on its event" if t.schedule_type == "when" else "-"  # a when task has no due time until then
        print(
            f"{t.id:<34} {t.group_folder:<16} {t.status:<10} {schedule:<28} {iso(t.next_run) or waiting:<29} "
            f"{last.get(t.id, '-'):<11} {_short(t.prompt)}"
        )
    return 0


def task_runs_list(args: argparse.Namespace, settings: Settings) -> int:
    """Print the latest runs of one task."""
    if args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    db = open_existing(settings)
    try:
        task = tasks.get_task(db.conn, args.task_id)
        if task is None:
            raise NotFound(f"no task with id {args.task_id!r}; `farmhost task list --all` shows every task")
        runs = task_runs.list_runs(db.conn, task.id, limit=args.limit)
    finally:
        db.close()
    if args.json:
        print(json_for_terminal([r.to_dict() for r in runs], indent=2))
        return 0
    schedule = f"{task.schedule_type} {task.schedule_value}"
    print(
        f"task {task.id} (group {task.group_folder}, {schedule}, {task.status}; next run {iso(task.next_run) or '-'})"
    )
    if not runs:
        print("no runs yet")
        return 0
    print(f"{'DUE':<29} {'STATUS':<11} {'DURATION':>9}  SUMMARY")
    for r in runs:
        duration = r.duration_seconds
        took = "-" if r.status == "skipped" else "running" if duration is None else f"{duration:.1f} s"
        print(f"{iso(r.due_at) or '-':<29} {r.status:<11} {took:>9}  {_short(r.detail or '', 80)}")
    return 0


def outbox_list(args: argparse.Namespace, settings: Settings) -> int:
    """Print the outbox."""
    db = open_existing(settings)
    try:
        rows = outbox.list_entries(db.conn, status=args.status, limit=args.limit)
    finally:
        db.close()
    if args.json:
        print(json_for_terminal([e.to_dict() for e in rows], indent=2))
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
            print(f"{'':>6} last error: {for_terminal(e.last_error)}")
    return 0


def _short(text: str, width: int = 60) -> str:
    """One table cell: on one line, what a terminal would act on written out, at most `width` characters."""
    flat = for_terminal(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: width - 1] + "…"
