"""The console channel: the terminal stands in for the Telegram main chat `local:main` during the demo.

- Each line read from stdin is a message in `local:main`: stored in the transcript (direction `in`), then run
  as an agent run of the main group (`AgentJob(folder="main", prompt=line, scheduled=False, context_mode="group",
  chat_jid="local:main")`) through the App's runtime, one at a time, in order.
- The run's answer (or, when it failed, one line saying why) is printed and stored in the transcript (`out`).
- Messages for `local:*` chats in the durable outbox (what agents send with `send_message`, task alerts) are
  printed and marked sent by this channel, since no Telegram delivers them; each lands in the transcript as
  Telegram's delivery would put it there. They are printed before the answer of the run that sent them.
- Without an LLM (or when no LLM endpoint answers) Home Assistant's Assist answers through the farm action
  `ha_assist` (farmhost/agents/fallback.py); the first such answer in the chat comes with a notice saying so and
  what an LLM would add (given once per chat, remembered in the database).
- Farm alerts (farm/state/alert_notifier.py) reach this chat through the outbox like any host message; their buttons are
  printed as the commands that press them: `ack N` (Acknowledge) and `snooze N` (Snooze 1 h), answered by the
  host itself, never by an agent run.

stdin is read by a daemon thread with `os.read` (no Python buffer lock, so a blocked read never holds up the
exit); end of input is reported as None.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Callable
from typing import Final

from farmhost.agents.fallback import ASSISTANT_NAME, NOTICE_KEY, assist_notice
from farmhost.agents.jobs import AgentJob, AgentOutcome
from farmhost.agents.runtime import AgentRuntime
from farmhost.farm.state import alert_notifier as alert_notify
from farmhost.farm.state.alert_notifier import AlertNotifier
from farmhost.store import chat_notices, chats, outbox, transcripts
from farmhost.store.db import Database, now_utc
from farmhost.store.outbox import OutboxEntry

CHANNEL: Final = "console"
BOT: Final = "farm bot"
SENDER_IN: Final = "you"
SENDER_OUT: Final = "farmhost"
OUTBOX_POLL: Final = 0.5
MAX_LINE_CHARS: Final = 16384
# The terminal's stand-in for an alert's buttons: `ack 12` / `snooze 12` (the notice id the message names).
_ALERT_COMMAND: Final = re.compile(r"^(ack|snooze)\s+([1-9][0-9]{0,11})$", re.IGNORECASE)
ALERT_PRESSER: Final = "you (terminal)"

Say = Callable[[str], None]


class StdinLines:
    """Lines from a file descriptor (stdin), read by a daemon thread into an asyncio queue; None at end of input."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int = 0) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = loop
        self._fd = fd
        self._thread = threading.Thread(target=self._read, name="demo-stdin", daemon=True)

    def start(self) -> StdinLines:
        """Start reading."""
        self._thread.start()
        return self

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self._fd, 4096):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    self._put(line.decode(errors="replace"))
        except OSError:
            pass
        if pending:
            self._put(pending.decode(errors="replace"))
        self._put(None)

    def _put(self, line: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the demo is over
            self._loop.call_soon_threadsafe(self.queue.put_nowait, line)


class ConsoleChat:
    """One chat (`jid`, the main group's `folder`) on the terminal."""

    def __init__(
        self,
        *,
        db: Database,
        runtime: AgentRuntime,
        jid: str,
        folder: str,
        llm_configured: bool,
        say: Say,
        no_llm_hint: str,
        alerts: AlertNotifier | None = None,
    ) -> None:
        self._db = db
        self._runtime = runtime
        self._jid = jid
        self._folder = folder
        self._llm_configured = llm_configured
        self._say = say
        self._no_llm_hint = no_llm_hint
        self._alerts = alerts
        self._deliver_lock = asyncio.Lock()
        self._submits: set[asyncio.Future[AgentOutcome]] = set()
        self.answered = 0

    async def handle(self, line: str, *, echo: bool) -> None:
        """One message from the terminal: store it, run the agent, print and store what comes back."""
        text = line.strip()[:MAX_LINE_CHARS]
        if not text:
            return
        if echo:
            self._say(f"{SENDER_IN}: {text}")
        if (command := _ALERT_COMMAND.fullmatch(text)) is not None and self._alerts is not None:
            notice_id = int(command[2])
            if command[1].lower() == alert_notify.ACK:
                answer = self._alerts.acknowledge(notice_id, self._jid, ALERT_PRESSER)
            else:
                answer = self._alerts.snooze(notice_id, self._jid, ALERT_PRESSER)
            self._say(f"{BOT}: {answer}")
            return
        now = now_utc()
        with self._db.tx() as conn:
            chats.upsert_chat(conn, jid=self._jid, name="Farm office (terminal)", channel=CHANNEL, seen_at=now)
            transcripts.append(
                conn,
                chat_jid=self._jid,
                direction="in",
                sender=SENDER_IN,
                text=text,
                at=now,
                message_key=f"console:{now.timestamp():.6f}",
            )
        if self._llm_configured:
            self._say(f"({BOT} is working on it ...)")
        job = AgentJob(
            folder=self._folder, prompt=text, scheduled=False, context_mode="group", chat_jid=self._jid, message=text
        )
        # Shielded: the chat being cancelled (the demo stops) must not orphan the agent; the runtime ends its runs.
        submitted = asyncio.ensure_future(self._runtime.submit(job))
        self._submits.add(submitted)
        submitted.add_done_callback(self._submits.discard)
        outcome = await asyncio.shield(submitted)
        await self.deliver_outbox()  # what the agent sent during the run comes before its answer
        if outcome.status == "ok":
            reply = (outcome.answer or "").strip() or "(the agent finished without an answer)"
        else:
            first = (outcome.error or f"the run ended with {outcome.status}").strip().splitlines()
            reply = f"I couldn't finish that: {first[0] if first else outcome.status}"
        notice = None
        if outcome.answered_by == ASSISTANT_NAME:
            with self._db.tx() as conn:
                if chat_notices.give_once(conn, jid=self._jid, notice=NOTICE_KEY, at=now_utc()):
                    notice = assist_notice(outcome.fallback_why)
        if notice is not None:
            self._say(f"({notice})")
        self._say(f"{BOT}: {reply}")
        if outcome.status != "ok" and not self._llm_configured:
            self._say(self._no_llm_hint)
        with self._db.tx() as conn:
            transcripts.append(
                conn,
                chat_jid=self._jid,
                direction="out",
                sender=SENDER_OUT,
                text=reply,
                at=now_utc(),
                message_key=f"console-reply:{outcome.run_id}",
            )
        self.answered += 1

    async def deliver_outbox(self) -> int:
        """Print and mark sent every pending outbox entry of this chat, oldest first; returns how many."""
        delivered = 0
        async with self._deliver_lock:
            while True:
                with self._db.tx() as conn:
                    entry = outbox.chat_head(conn, self._jid)
                    if entry is None:
                        return delivered
                    text = _entry_text(entry)
                    now = now_utc()
                    if outbox.mark_sent(conn, entry.id, telegram_message_id=None, at=now):
                        transcripts.append(
                            conn,
                            chat_jid=entry.chat_jid,
                            direction="out",
                            sender=SENDER_OUT,
                            text=text,
                            at=now,
                            message_key=f"outbox:{entry.id}",
                        )
                source = f" (from {entry.source_folder})" if entry.source_folder else ""
                self._say(f"{BOT} [message{source}]: {text}{_alert_buttons(entry)}")
                delivered += 1

    async def deliver_forever(self) -> None:
        """Deliver this chat's outbox every OUTBOX_POLL seconds (messages of scheduled runs arrive this way)."""
        while True:
            await self.deliver_outbox()
            await asyncio.sleep(OUTBOX_POLL)


def _entry_text(entry: OutboxEntry) -> str:
    chunk = f" ({entry.chunk_index + 1}/{entry.chunk_count})" if entry.chunk_count > 1 else ""
    if entry.kind == "file":
        return f"[file {entry.file_path}]{chunk} {entry.body or ''}".rstrip()
    return f"{entry.body or ''}{chunk}"


def _alert_buttons(entry: OutboxEntry) -> str:
    """An alert's Acknowledge / Snooze buttons as the terminal commands that press them ("" for other messages)."""
    markup = entry.options.get("reply_markup")
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    for row in rows if isinstance(rows, list) else []:
        for button in row if isinstance(row, list) else []:
            parsed = alert_notify.parse_callback(button.get("callback_data") if isinstance(button, dict) else None)
            if parsed is not None:
                notice_id = parsed[0]
                return f"\n  (type `ack {notice_id}` to acknowledge, `snooze {notice_id}` to be reminded in 1 h)"
    return ""
