"""`farmhost group add|list|remove`: the operator's registry commands (the only way to choose main)."""

from __future__ import annotations

import argparse
from typing import Any

from farmhost.cli.commands import open_existing
from farmhost.config import Settings
from farmhost.groups.registry import new_group, register, unregister
from farmhost.layout import DataLayout
from farmhost.store import groups
from farmhost.store.db import Database, iso, now_utc
from farmhost.terminal import for_terminal, json_for_terminal


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register the `group` sub-commands."""
    group = sub.add_parser(
        "group",
        help="registered chats and their workspace folders",
        description="Register, list and remove groups: a chat (jid) bound to a workspace folder.",
    )
    cmds = group.add_subparsers(dest="group_command", required=True)
    p = cmds.add_parser(
        "add",
        parents=[common],
        help="register a chat as a group",
        description="Register a chat as a group and create groups/<folder>/ and "
        "ipc/<folder>/{messages,tasks,actions,action_results}. The folder must match "
        "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ and not be 'global' or 'errors'. "
        "Exactly one group is main; only this command can choose it.",
    )
    p.add_argument("--jid", required=True, help="chat id, e.g. telegram:-1001234")
    p.add_argument("--name", required=True, help="display name")
    p.add_argument("--folder", required=True, help="workspace folder: letters, digits, '_' or '-' (max 64)")
    p.add_argument("--trigger", help="word that addresses the agent in this chat (default @<first word of name>)")
    p.add_argument("--main", action="store_true", help="make this the main (operator) group; only one may exist")
    p.add_argument(
        "--no-trigger-required", action="store_true", help="the agent answers every message, not only triggered ones"
    )
    p.set_defaults(func=add)
    p = cmds.add_parser(
        "list", parents=[common], help="list registered groups", description="List the registered groups."
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=list_)
    p = cmds.add_parser(
        "remove",
        parents=[common],
        help="unregister a group (its files are kept)",
        description="Unregister a group. Its workspace and IPC files are kept; a running daemon stops serving it.",
    )
    p.add_argument("folder", help="the group's folder")
    p.set_defaults(func=remove)


def add(args: argparse.Namespace, settings: Settings) -> int:
    """Register a group; a running daemon starts serving it within a second."""
    layout = DataLayout(settings.data_dir)
    layout.create()
    db = Database.open(settings.data_dir)
    try:
        with db.tx() as conn:
            group = new_group(
                conn,
                jid=args.jid,
                name=args.name,
                folder=args.folder,
                trigger=args.trigger,
                requires_trigger=not args.no_trigger_required,
                is_main=args.main,
                at=now_utc(),
            )
            held = register(conn, layout, group, reuse=True)
    finally:
        db.close()
    kind = "main group" if group.is_main else "group"
    print(f"added {kind} {group.folder!r} for {group.jid} (trigger {group.trigger!r})")
    print(f"  workspace: {layout.workspace(group.folder)}")
    print(f"  ipc:       {layout.group_ipc(group.folder)}")
    if held is not None:
        print(f"  reused:    {held} left by a group removed earlier")
    return 0


def list_(args: argparse.Namespace, settings: Settings) -> int:
    """Print the registry."""
    db = open_existing(settings)
    try:
        rows = groups.list_groups(db.conn)
    finally:
        db.close()
    if args.json:
        print(json_for_terminal([g.to_dict() for g in rows], indent=2))
        return 0
    if not rows:
        print("no groups; add one with: farmhost group add --jid telegram:<id> --name <name> --folder <folder> --main")
        return 0
    print(f"{'FOLDER':<20} {'MAIN':<5} {'JID':<28} {'TRIGGER':<16} {'REQUIRED':<9} {'ADDED':<29} NAME")
    for g in rows:
        print(
            f"{g.folder:<20} {'yes' if g.is_main else '':<5} {g.jid:<28} {for_terminal(g.trigger or '-'):<16} "
            f"{'yes' if g.requires_trigger else 'no':<9} {iso(g.added_at) or '':<29} {for_terminal(g.name)}"
        )
    return 0


def remove(args: argparse.Namespace, settings: Settings) -> int:
    """Unregister a group; a running daemon stops serving it within a second."""
    db = open_existing(settings)
    try:
        with db.tx() as conn:
            group, dropped = unregister(conn, args.folder)
    finally:
        db.close()
    print(f"removed group {group.folder!r} ({group.jid}); its workspace and IPC files were kept")
    if dropped:
        print(f"dropped:   {dropped} undelivered message chunk(s) of the group will not be sent (farmhost outbox list)")
    return 0
