"""Helpers of the inbound Telegram tests: the real services on a real data dir, PTB against the fake Bot API.

TelegramInbound, the real AgentRuntime (process backend) running an echo agent, and optionally the real
OutboxDelivery, started and stopped in the app's order.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmhost_testing import MAIN_JID, group_lookup, init_data_dir_in_process, wait_for_async
from telegram import Bot
from telegram_stub import FakeTelegram

from farmhost.agents.runtime import AgentRuntime
from farmhost.config import Settings, build_config
from farmhost.emergency_stop import EmergencyStop
from farmhost.farm.audit import AuditLog
from farmhost.groups.live import GroupRegistry
from farmhost.ipc.ping import ping_handlers
from farmhost.ipc.service import IpcService
from farmhost.ipc.snapshots import HostIdentity
from farmhost.layout import DataLayout
from farmhost.store.db import Database, now_utc
from farmhost.telegram.bot import make_bot
from farmhost.telegram.delivery.worker import OutboxDelivery
from farmhost.telegram.inbound.receiver import TelegramInbound
from farmhost.voice.stt import SpeechToText

MAIN_CHAT, FIELD_CHAT = 100, 200
assert f"telegram:{MAIN_CHAT}" == MAIN_JID

# The echo agent: records the AgentInput it got (prompts.jsonl in its workspace), sleeps when the prompt says
# `sleep=N` (`sleep-once=N`: only the first time), fails when it says `please fail`, else answers "echo: <the prompt's last line>".
ECHO = r"""
import json, os, re, sys, time
doc = json.load(sys.stdin)
prompt = doc["prompt"]
with open(os.path.join(os.environ["FARMAGENT_GROUP_DIR"], "prompts.jsonl"), "a") as f:
    f.write(json.dumps(doc) + "\n")
m = re.search(r"sleep=([0-9.]+)", prompt)
if m:
    time.sleep(float(m.group(1)))
m = re.search(r"sleep-once=([0-9.]+)", prompt)
marker = os.path.join(os.environ["FARMAGENT_GROUP_DIR"], "slept-once")
if m and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(float(m.group(1)))
if "please fail" in prompt:
    error = "the pump controller is offline\nTraceback (most recent call last):\n  File 'x.py'"
    print(json.dumps({"status": "error", "answer": None, "error": error}))
else:
    print(json.dumps({"status": "ok", "answer": "echo: " + prompt.splitlines()[-1], "turns": 1}))
"""
ECHO_COMMAND = (sys.executable, "-c", ECHO)


def settings_for(root: Path, tg: FakeTelegram, **values: Any) -> Settings:
    """Settings on `root` talking to the fake Bot API, from nothing but `values` (no .env, no shell variables)."""
    env: dict[str, Any] = {
        "FARMHOST_DATA_DIR": root,
        "TZ": "Europe/Lisbon",
        "TELEGRAM_BOT_TOKEN": tg.token,
        "TELEGRAM_API_BASE_URL": tg.api_root,
        "FARMHOST_TELEGRAM_POLL_TIMEOUT": 2,
        "FARMHOST_AGENT_RUNTIME": "process",
        **values,
    }
    return Settings(_env_file=None, **env)  # type: ignore[call-arg]


def new_data_dir(tmp_path: Path) -> Path:
    """A data dir with `main` (telegram:100, main) and `field` (telegram:200, trigger @Field)."""
    return init_data_dir_in_process(tmp_path / "data")


async def _no_hook(folder: str) -> None:
    return None


async def _no_memory(folder: str, prompt: str) -> list[dict[str, Any]]:
    return []


def make_runtime(settings: Settings, command: Sequence[str] | None = ECHO_COMMAND) -> AgentRuntime:
    """The real runtime on the settings' data dir, running the echo agent (`command=None`: the settings' own)."""
    return AgentRuntime(
        settings=build_config(settings).agents,
        layout=DataLayout(settings.data_dir),
        group=group_lookup(settings.data_dir),
        before_run=_no_hook,
        memory_snippets=_no_memory,
        command=command,
        term_grace=1.0,
    )


@dataclass
class Host:
    """One running set: database, runtime, inbound (and delivery); what the callbacks saw."""

    settings: Settings
    db: Database
    runtime: AgentRuntime
    bot: Bot
    inbound: TelegramInbound
    delivery: OutboxDelivery | None
    ipc: IpcService | None
    wakes: list[float] = field(default_factory=list)
    groups_changed: list[float] = field(default_factory=list)

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return list(self.db.conn.execute(sql, args))

    def transcript(self, jid: str) -> list[tuple[str, str | None, str]]:
        rows = self.rows("SELECT direction, sender, text FROM transcript WHERE chat_jid = ? ORDER BY id", jid)
        return [(r["direction"], r["sender"], r["text"]) for r in rows]

    def outbox(self, jid: str | None = None) -> list[sqlite3.Row]:
        return self.rows("SELECT * FROM outbox WHERE (? IS NULL OR chat_jid = ?) ORDER BY id", jid, jid)

    def update(self, update_id: int) -> sqlite3.Row | None:
        rows = self.rows("SELECT * FROM telegram_updates WHERE update_id = ?", update_id)
        return rows[0] if rows else None

    def offset(self) -> int | None:
        rows = self.rows("SELECT value FROM host_state WHERE key = 'telegram_offset'")
        return int(rows[0][0]) if rows else None


@asynccontextmanager
async def running(
    settings: Settings,
    *,
    deliver: bool = False,
    start_runtime: bool = True,
    ipc: bool = False,
    status: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    typing_interval: float = 0.3,
    command: Sequence[str] | None = ECHO_COMMAND,
    stt: SpeechToText | None = None,
    emergency_stop: bool = False,
) -> AsyncIterator[Host]:
    """Start runtime (running `command`; None: the settings' agent), inbound (and delivery, and IPC) on the data dir.

    `stt`: the engine that hears voice notes (its owner closes it). `emergency_stop`: the real EmergencyStop behind
    /stop and /resume, without Home Assistant. They are stopped in the app's order at the end.
    """
    db = Database.open(settings.data_dir)
    registry = GroupRegistry(db)
    service: IpcService | None = None
    if ipc:
        identity = HostIdentity(pid=os.getpid(), version="test", started_at=now_utc())
        layout = DataLayout(settings.data_dir)
        service = IpcService(
            settings=build_config(settings).ipc,
            layout=layout,
            db=db,
            registry=registry,
            handlers=ping_handlers(identity),
            identity=identity,
        )
        await service.start()
    runtime = make_runtime(settings, command)
    if start_runtime:
        await runtime.start()
    telegram = build_config(settings).telegram
    bot = make_bot(telegram)
    delivery = (
        OutboxDelivery(
            db=db,
            settings=telegram,
            layout=DataLayout(settings.data_dir),
            bot=bot,
            on_groups_changed=lambda: groups_changed(),
        )
        if deliver
        else None
    )
    host: Host

    def wake() -> None:
        host.wakes.append(time.monotonic())
        if delivery is not None:
            delivery.wake()

    def groups_changed() -> None:
        host.groups_changed.append(time.monotonic())
        registry.reload()

    config = build_config(settings)
    stop = (
        EmergencyStop(
            db=db,
            runtime=runtime,
            ha=None,
            profile_path=config.farm.profile_path,
            audit=AuditLog(DataLayout(settings.data_dir).farm_state, max_bytes=config.farm.audit_max_bytes),
            wake_outbox=lambda: wake(),
        )
        if emergency_stop
        else None
    )
    inbound = TelegramInbound(
        db=db,
        settings=telegram,
        layout=DataLayout(settings.data_dir),
        bot=bot,
        runtime=runtime,
        wake_outbox=wake,
        status=status,
        on_groups_changed=groups_changed,
        stop=stop,
        stt=stt,
        typing_interval=typing_interval,
        retry_delays=(0.05, 0.2),
    )
    host = Host(settings=settings, db=db, runtime=runtime, bot=bot, inbound=inbound, delivery=delivery, ipc=service)
    if delivery is not None:
        await delivery.start()
    await inbound.start()
    try:
        yield host
    finally:
        await inbound.stop()
        if delivery is not None:
            await delivery.stop()
        await runtime.stop()
        await bot.shutdown()
        if service is not None:
            await service.stop()
        db.close()


async def until(condition: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> Any:
    """Poll `condition` on the event loop (the services run meanwhile) until it is truthy (`timeout` scaled)."""
    return await wait_for_async(condition, timeout=timeout, interval=0.02, what=what)


async def wait_sent(tg: FakeTelegram, count: int, chat_id: int | None = None, timeout: float = 10.0) -> list[Any]:
    """FakeTelegram.wait_sent without blocking the event loop."""
    return await asyncio.to_thread(tg.wait_sent, count, chat_id, timeout)


async def wait_calls(tg: FakeTelegram, method: str, count: int = 1, timeout: float = 10.0) -> list[Any]:
    """FakeTelegram.wait_calls without blocking the event loop."""
    return await asyncio.to_thread(tg.wait_calls, method, count, timeout)


def prompts(root: Path, folder: str) -> list[dict[str, Any]]:
    """The AgentInputs the echo agent of `folder` received, in order."""
    path = root / "groups" / folder / "prompts.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def calls(tg: FakeTelegram, method: str) -> list[Any]:
    """Every call of `method` so far."""
    return [call for call in tg.calls if call.method.lower() == method.lower()]
