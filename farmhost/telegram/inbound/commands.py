"""Operator commands: `/help` in every registered chat, `/status`, `/tasks`, `/stop`, `/resume` in the main chat only.

The texts are built here from data (the registry row, the status document, the tasks table); the inbound loop
puts them into the outbox as plain text.

The status document (`status()` in the app, merged over what the database and the runtime say) has these keys,
all optional: `version` (str), `started_at` (datetime or ISO text), `home_assistant` ("up", "down", "off", a
bool, or a sentence), `agents_running`, `agents_queued`, `outbox_pending`, `outbox_failed`, `tasks_active`
(ints), `agents_paused` (why agent runs are paused, e.g. "stopped by /stop (@ana, ...)"; None while they run);
any other key is shown as `key: value`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final
from zoneinfo import ZoneInfo

from telegram import Bot, BotCommand, BotCommandScopeChat
from telegram.error import TelegramError

from farmhost.outbox.text import one_line
from farmhost.store import outbox, tasks
from farmhost.store.groups import Group
from farmhost.store.tasks import Task
from farmhost.telegram.bot import chat_id_of
from farmhost.telegram.inbound.routing import MAIN_ONLY_COMMANDS

# Telegram's command menu (setMyCommands): everyone sees /help, the main chat also the operator commands.
MENU: Final = {"help": "What I do and how to talk to me"}
MAIN_MENU: Final = {
    **MENU,
    "status": "Home Assistant, agents, outbox and tasks",
    "tasks": "The scheduled tasks",
    "stop": "EMERGENCY STOP: every guarded device safe, agents paused",
    "resume": "Let agents run again after /stop (turns nothing on)",
}
TASKS_SHOWN: Final = 30
_KNOWN_STATUS_KEYS: Final = (
    "version",
    "started_at",
    "home_assistant",
    "agents_running",
    "agents_queued",
    "outbox_pending",
    "outbox_failed",
    "tasks_active",
    "agents_paused",
)


async def set_menus(bot: Bot, main: Group | None) -> str | None:
    """Set Telegram's command menus: MENU for everyone, MAIN_MENU in the main chat; returns why it failed, or None."""
    try:
        await bot.set_my_commands([BotCommand(name, text) for name, text in MENU.items()])
        if main is not None:
            await bot.set_my_commands(
                [BotCommand(name, text) for name, text in MAIN_MENU.items()],
                scope=BotCommandScopeChat(chat_id_of(main.jid)),
            )
    except (TelegramError, ValueError) as err:
        return str(err)
    return None


def help_text(group: Group, bot_username: str) -> str:
    """`/help`: what the bot does and how to address it in this chat."""
    lines = ["I'm the farm's assistant: I read Home Assistant, run farm actions, keep notes and scheduled tasks."]
    if group.is_main or not group.requires_trigger:
        lines.append("In this chat every message is for me; just write.")
    else:
        how = f"start a message with {group.trigger} or mention @{bot_username}" if group.trigger else ""
        how = how or f"mention @{bot_username}"
        lines.append(
            f"In this chat, {how}, or reply to one of my messages. "
            "Other messages here are kept as context for my next answer."
        )
    lines.append("Photos, voice notes, documents and locations reach me too.")
    lines.append("")
    lines.append("/help - this text")
    if group.is_main:
        lines.append("/status - Home Assistant, agents, outbox and tasks")
        lines.append("/tasks - the scheduled tasks")
        lines.append("/stop - emergency stop: every guarded device to its safe state (off, closed), agents paused")
        lines.append("/resume - let agents run again after /stop (turns nothing back on)")
    return "\n".join(lines)


def refusal(command: str) -> str:
    """The answer to a main-only command in another chat."""
    assert command in MAIN_ONLY_COMMANDS
    return f"/{command} works only in the farm's main chat."


def collect_status(
    conn: sqlite3.Connection,
    *,
    running: int,
    queued: int,
    extra: Mapping[str, Any] | None,
    paused: str | None = None,
) -> dict[str, Any]:
    """The status document: counts from the database and the runtime (`paused`: its reason), then the app's `extra`."""
    counts = outbox.count_by_status(conn)
    active = sum(1 for task in tasks.list_tasks(conn) if task.status == "active")
    document: dict[str, Any] = {
        "agents_running": running,
        "agents_queued": queued,
        "outbox_pending": counts.get("pending", 0),
        "outbox_failed": counts.get("failed", 0),
        "tasks_active": active,
        "agents_paused": paused,
    }
    document.update(extra or {})
    return document


def status_text(status: Mapping[str, Any], *, now: datetime, zone: ZoneInfo) -> str:
    """`/status`: the status document as a few readable lines."""
    head = "Farm status"
    version = status.get("version")
    started = _moment(status.get("started_at"))
    details = [f"farmhost {version}" if version else "", f"up {_duration(now - started)}" if started else ""]
    if any(details):
        head += f" ({', '.join(d for d in details if d)})"
    lines = [head, f"Home Assistant: {_home_assistant(status.get('home_assistant'))}"]
    lines.append(f"Agents: {_count(status, 'agents_running')} running, {_count(status, 'agents_queued')} queued")
    if paused := status.get("agents_paused"):
        lines.append(f"Agents are PAUSED: {one_line(str(paused), 200)}; /resume lets them run again")
    failed = status.get("outbox_failed")
    outbox_line = f"Outbox: {_count(status, 'outbox_pending')} waiting, {_count(status, 'outbox_failed')} failed"
    if isinstance(failed, int) and failed > 0:
        outbox_line += " (see `farmhost outbox list`)"
    lines.append(outbox_line)
    lines.append(f"Tasks: {_count(status, 'tasks_active')} active")
    for key, value in status.items():
        if key not in _KNOWN_STATUS_KEYS:
            lines.append(f"{one_line(str(key), 40)}: {one_line(str(value), 200)}")
    return "\n".join(lines)


def tasks_text(
    rows: Sequence[Task], last_status: Mapping[str, str], *, zone: ZoneInfo, limit: int = TASKS_SHOWN
) -> str:
    """`/tasks`: id, group, schedule, next run (local time), last run's status and the prompt's start."""
    if not rows:
        return 'There are no scheduled tasks. Ask me to schedule one, e.g. "check the tanks every morning at 7".'
    lines = [f"Scheduled tasks ({len(rows)}):"]
    for task in rows[:limit]:
        next_run = f"{task.next_run.astimezone(zone):%a %d %b %H:%M}" if task.next_run else "none"
        state = "" if task.status == "active" else f" [{task.status}]"
        last = last_status.get(task.id, "never run")
        lines.append(
            f"• {task.id} ({task.group_folder}){state}: {task.schedule_type} {one_line(task.schedule_value, 60)}; "
            f"next {next_run}; last {last}"
        )
        lines.append(f"  {one_line(task.prompt, 80)}")
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more (`farmhost task list` shows all)")
    return "\n".join(lines)


def _count(status: Mapping[str, Any], key: str) -> str:
    value = status.get(key)
    return str(value) if isinstance(value, int) else "?"


def _home_assistant(value: Any) -> str:
    if value is None:
        return "unknown"
    if value is True:
        return "up"
    if value is False:
        return "down"
    text = one_line(str(value), 200)
    return "off (HA_URL / HA_TOKEN not set)" if text == "off" else text


def _moment(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def _duration(span: Any) -> str:
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"
