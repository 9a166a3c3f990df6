"""OutboxDelivery with the real PTB Bot against the fake Bot API: order, formatting, retries, failures, restarts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from farmhost_testing import farmhost, wait_for_async
from telegram import Bot
from telegram_stub import Call, FakeTelegram

from farmhost.config import Settings, TelegramSettings, build_config
from farmhost.layout import DataLayout
from farmhost.outbox.chunking import split_text
from farmhost.store import outbox, transcripts
from farmhost.store.db import Database, now_utc
from farmhost.store.outbox import OutboxEntry
from farmhost.telegram.bot import make_bot
from farmhost.telegram.delivery.worker import OutboxDelivery

T = TypeVar("T")
# PTB 22 warns whenever it builds a RetryAfter (its `retry_after` becomes a timedelta in v23); production ignores
# DeprecationWarnings, and so do these tests, so that a 429 takes the same path as on a farm.
pytestmark = pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
FIELD, OFFICE = -1001, -1002  # two group chats
KEYBOARD = {
    "inline_keyboard": [
        [{"text": "Approve", "callback_data": "approve:7"}, {"text": "Reject", "callback_data": "reject:7"}]
    ]
}
# A 1x1 PNG: Telegram would really take it; the fake only keeps the bytes.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


async def until(condition: Callable[[], T], *, timeout: float = 5.0, what: str = "") -> T:
    """Poll `condition` on the event loop (the delivery runs on it too) until it is truthy (`timeout` scaled)."""
    return await wait_for_async(condition, timeout=timeout, what=what)


@dataclass
class Rig:
    """A data dir, its database, a real Bot pointed at the fake, and the deliveries started on them."""

    root: Path
    db: Database
    layout: DataLayout
    settings: TelegramSettings
    bot: Bot
    fake: FakeTelegram
    deliveries: list[OutboxDelivery] = field(default_factory=list)
    _keys: int = 0

    async def start(self, *, retry_seconds: float = 0.02, **kwargs: Any) -> OutboxDelivery:
        """A delivery whose first retry waits `retry_seconds` (FARMHOST_OUTBOX_RETRY_SECONDS)."""
        options: dict[str, Any] = {"backoff_cap": 0.2, "rescan_interval": 0.5, **kwargs}
        settings = replace(self.settings, outbox_retry_seconds=retry_seconds)
        delivery = OutboxDelivery(db=self.db, settings=settings, layout=self.layout, bot=self.bot, **options)
        await delivery.start()
        self.deliveries.append(delivery)
        return delivery

    def queue(
        self,
        chat_id: int,
        chunks: list[str],
        *,
        at: datetime | None = None,
        source_folder: str | None = "main",
        **kwargs: Any,
    ) -> list[OutboxEntry]:
        self._keys += 1
        key = f"test:{self._keys}"
        with self.db.tx() as conn:
            outbox.enqueue(
                conn,
                message_key=key,
                chat_jid=f"telegram:{chat_id}",
                source_folder=source_folder,
                chunks=chunks,
                at=at or now_utc(),
                **kwargs,
            )
        return [e for e in outbox.list_entries(self.db.conn, limit=10_000) if e.message_key == key]

    def queue_file(self, chat_id: int, name: str, content: bytes, caption: str = "") -> OutboxEntry:
        copy = self.layout.outbox_files / "main" / f"r{self._keys}-{name}"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(content)
        (entry,) = self.queue(chat_id, [caption], kind="file", file_path=str(copy), options={"file_name": name})
        return entry

    def entry(self, entry_id: int) -> OutboxEntry:
        found = outbox.get_entry(self.db.conn, entry_id)
        assert found is not None
        return found

    def settled(self, entries: list[OutboxEntry]) -> list[OutboxEntry]:
        """The entries again, once none of them is pending any more (else an empty list)."""
        now = [self.entry(e.id) for e in entries]
        return now if all(e.status != "pending" for e in now) else []

    async def wait_sent(self, count: int, chat_id: int | None = None, timeout: float = 5) -> list[Call]:
        return await asyncio.to_thread(self.fake.wait_sent, count, chat_id, timeout)

    def transcript(self, chat_id: int) -> list[transcripts.MessageRow]:
        return transcripts.latest(self.db.conn, [f"telegram:{chat_id}"])


@pytest.fixture
async def rig(tmp_path: Path, fake_telegram: FakeTelegram) -> AsyncIterator[Rig]:
    root = tmp_path / "data"
    layout = DataLayout(root)
    layout.create()
    db = Database.open(root)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=root,
        telegram_bot_token=fake_telegram.token,
        telegram_api_base_url=fake_telegram.api_root,
        outbox_max_attempts=4,
    )
    telegram = build_config(settings).telegram
    bot = make_bot(telegram)
    await bot.initialize()
    rig = Rig(root=root, db=db, layout=layout, settings=telegram, bot=bot, fake=fake_telegram)
    try:
        yield rig
    finally:
        for delivery in rig.deliveries:
            await delivery.stop()
        await bot.shutdown()
        db.close()


def with_settings(rig: Rig, **values: Any) -> None:
    rig.settings = replace(rig.settings, **values)


def long_reply() -> str:
    return "\n\n".join(
        f"Paragraph {i}: the north field needs water at dawn, {'and more words ' * 12}" for i in range(40)
    )


async def test_a_long_message_arrives_as_ordered_chunks_and_is_kept_in_the_transcript(rig: Rig) -> None:
    chunks = split_text(long_reply())
    assert len(chunks) >= 3
    entries = rig.queue(FIELD, chunks)
    delivery = await rig.start()
    delivery.wake()
    sent = await rig.wait_sent(len(chunks), FIELD)
    assert [call.text for call in sent] == chunks
    assert all(call.params["parse_mode"] == "HTML" for call in sent)
    done = await until(lambda: rig.settled(entries))
    assert [e.status for e in done] == ["sent"] * len(chunks)
    assert [e.telegram_message_id for e in done] == [call.result["message_id"] for call in sent]
    assert all(e.sent_at is not None and e.attempts == 0 for e in done)
    rows = rig.transcript(FIELD)
    assert [(r.direction, r.sender, r.text) for r in rows] == [("out", "@farm_test_bot", c) for c in chunks]
    # a second delivery finds nothing to do; the transcript keeps one row per chunk
    await rig.start()
    await asyncio.sleep(0.2)
    assert len(rig.fake.sent(FIELD)) == len(chunks) and len(rig.transcript(FIELD)) == len(chunks)


async def test_markdown_is_sent_as_telegram_html(rig: Rig) -> None:
    text = "**Pump 3** is *on* <ok> & see `switch.pump_3` in [HA](https://ha.local:8123/config)"
    (entry,) = rig.queue(FIELD, [text])
    await rig.start()
    (call,) = await rig.wait_sent(1, FIELD)
    assert call.params["parse_mode"] == "HTML"
    assert call.text == (
        "<b>Pump 3</b> is <i>on</i> &lt;ok&gt; &amp; see <code>switch.pump_3</code> in "
        '<a href="https://ha.local:8123/config">HA</a>'
    )
    message = call.result
    assert message["text"] == "Pump 3 is on <ok> & see switch.pump_3 in HA"
    assert [e["type"] for e in message["entities"]] == ["bold", "italic", "code", "text_link"]
    # the transcript keeps what the agent wrote
    await until(lambda: rig.transcript(FIELD))
    assert rig.transcript(FIELD)[0].text == text and rig.entry(entry.id).status == "sent"


async def test_text_telegram_refuses_to_parse_goes_again_at_once_as_plain_text(rig: Rig) -> None:
    rig.fake.fail(
        "sendMessage",
        status=400,
        description='Bad Request: can\'t parse entities: Unsupported start tag "x" at byte offset 0',
        when=lambda params: params.get("parse_mode") == "HTML",
    )
    (entry,) = rig.queue(FIELD, ["**Tank** level <low>"])
    (kept_plain,) = rig.queue(FIELD, ["**stays** as written"], options={"format": "plain"})
    await rig.start()
    first, second = await rig.wait_sent(2, FIELD)
    assert first.text == "**Tank** level <low>" and "parse_mode" not in first.params
    assert second.text == "**stays** as written" and "parse_mode" not in second.params
    tries = [c for c in rig.fake.calls if c.method == "sendMessage"]
    assert [c.ok for c in tries] == [False, True, True]
    done = await until(lambda: rig.settled([entry, kept_plain]))
    # the choice is stored, so a retry after a crash would not flip back to HTML
    assert done[0].options == {"format": "plain"} and done[0].attempts == 0 and done[0].status == "sent"


def _chat(params: dict[str, Any]) -> int | None:
    value = params.get("chat_id")
    return int(value) if isinstance(value, int | str) and str(value).lstrip("-").isdigit() else None


async def test_retry_after_is_honoured_and_the_chunk_is_sent_once(rig: Rig) -> None:
    # The field chat's send is refused (the two chats are sent side by side: either may reach the fake first).
    rig.fake.fail("sendMessage", status=429, retry_after=1, when=lambda params: _chat(params) == FIELD)
    (entry,) = rig.queue(FIELD, ["after the flood"])
    (other,) = rig.queue(OFFICE, ["another chat does not wait"])
    await rig.start()
    (office,) = await rig.wait_sent(1, OFFICE)
    (field_call,) = await rig.wait_sent(1, FIELD)
    refused = next(c for c in rig.fake.calls if c.status == 429)
    assert field_call.at - refused.at >= 0.9
    assert office.at < field_call.at
    done = await until(lambda: rig.settled([entry]))
    assert done[0].attempts == 0 and done[0].last_error == "flood control: retry after 1 s"
    assert [c.text for c in rig.fake.sent(FIELD)] == ["after the flood"]
    assert rig.entry(other.id).status == "sent"


async def test_the_hosts_own_message_goes_ahead_of_an_agents_backlog_in_its_chat(rig: Rig) -> None:
    # A flood from an agent (main may write to the main chat without end) must not hold back a farm alert or an
    # approval for hours behind Telegram's per-chat rate; it waits only for the agent message already under way.
    started = rig.queue(FIELD, ["part 1 of 2", "part 2 of 2"])
    with rig.db.tx() as conn:  # the first part went before a restart
        outbox.mark_sent(conn, started[0].id, telegram_message_id=1, at=now_utc())
    backlog = [rig.queue(FIELD, [f"agent message {n}"]) for n in range(20)]
    (alert,) = rig.queue(FIELD, ["Frost risk in field 1"], source_folder=None)
    await rig.start()
    await rig.wait_sent(22, FIELD)
    texts = [c.text for c in rig.fake.sent(FIELD)]
    assert texts[:3] == ["part 2 of 2", "Frost risk in field 1", "agent message 0"]
    assert texts[3:] == [f"agent message {n}" for n in range(1, 20)]  # the agents' own order is kept
    done = await until(lambda: rig.settled([alert, *(e for (e,) in backlog)]))
    assert all(e.status == "sent" for e in done)


async def test_server_errors_and_dropped_connections_are_retried_and_delivered_once(rig: Rig) -> None:
    rig.fake.fail("sendMessage", status=500)
    rig.fake.fail("sendMessage", status=502, description="Bad Gateway")
    rig.fake.fail("sendMessage", drop_connection=True)
    (entry,) = rig.queue(FIELD, ["eventually"])
    await rig.start()
    await rig.wait_sent(1, FIELD)
    (done,) = await until(lambda: rig.settled([entry]))
    assert done.status == "sent" and done.attempts == 3  # the limit is 4: the fourth try went through
    assert [c.status for c in rig.fake.calls if c.method == "sendMessage"] == [500, 502, 0, 200]
    await asyncio.sleep(0.1)
    assert len(rig.fake.sent()) == 1


async def test_permanent_refusals_fail_at_once_and_show_in_the_cli(rig: Rig) -> None:
    rig.fake.unknown_chats.add(-404)
    rig.fake.fail(
        "sendMessage",
        status=403,
        description="Forbidden: bot was blocked by the user",
        when=lambda p: p["chat_id"] == 403,
    )
    missing = rig.queue(-404, ["one", "two", "three"])
    (blocked,) = rig.queue(403, ["hello"])
    (nowhere,) = rig.queue(FIELD, ["y"])
    with rig.db.tx() as conn:
        conn.execute("UPDATE outbox SET chat_jid = 'whatsapp:1' WHERE id = ?", (nowhere.id,))
    await rig.start()
    done = await until(lambda: rig.settled([*missing, blocked, nowhere]))
    assert [e.status for e in done] == ["failed"] * 5
    assert done[0].last_error == "Bad Request: Chat not found" and done[0].attempts == 1
    assert done[1].last_error == "chunk 1/3 of this message failed: Bad Request: Chat not found"
    assert done[3].last_error == "Forbidden: bot was blocked by the user"
    assert "not a Telegram chat" in (done[4].last_error or "")
    # one try each: no plain-text retry for a missing chat, nothing after the first chunk
    # (the two chats are sent side by side: either may reach the fake first)
    assert sorted(c.chat_id for c in rig.fake.calls if c.method == "sendMessage" and not c.ok) == [-404, 403]

    listing = farmhost("outbox", "list", "--status", "failed", data_dir=rig.root)
    assert listing.returncode == 0, listing.stderr
    assert "last error: Bad Request: Chat not found" in listing.stdout
    assert "last error: Forbidden: bot was blocked by the user" in listing.stdout
    rows = json.loads(farmhost("outbox", "list", "--status", "failed", "--json", data_dir=rig.root).stdout)
    assert len(rows) == 5 and {r["status"] for r in rows} == {"failed"}

    for delivery in rig.deliveries:
        await delivery.stop()
    rig.queue(FIELD, ["queued long ago"], at=now_utc() - timedelta(minutes=11))
    doctor = farmhost("doctor", data_dir=rig.root)
    assert "5 chunk(s) failed to deliver" in doctor.stdout and "farmhost outbox list --status failed" in doctor.stdout
    assert "1 chunk(s) still pending after 10 minutes" in doctor.stdout
    assert "Telegram is off: set TELEGRAM_BOT_TOKEN" in doctor.stdout  # the doctor runs without the token
    assert doctor.returncode == 1


async def test_after_max_attempts_the_entry_fails_with_the_last_error(rig: Rig) -> None:
    rig.fake.fail("sendMessage", status=500, times=100, when=lambda p: p["chat_id"] == FIELD)
    entries = rig.queue(FIELD, ["never", "arrives"])
    (fine,) = rig.queue(OFFICE, ["fine"])
    await rig.start()
    await rig.wait_sent(1, OFFICE)
    done = await until(lambda: rig.settled(entries))
    assert [e.status for e in done] == ["failed", "failed"]
    assert done[0].attempts == 4 and done[0].last_error == "gave up after 4 attempts: Internal Server Error"
    assert len([c for c in rig.fake.calls if c.chat_id == FIELD]) == 4
    assert rig.entry(fine.id).status == "sent"


async def test_an_outage_loses_nothing_duplicates_nothing_and_keeps_each_chats_order(rig: Rig) -> None:
    with_settings(rig, outbox_max_attempts=100)
    rig.fake.fail("sendMessage", status=503, description="Service Unavailable", times=10_000)
    expected: dict[int, list[str]] = {FIELD: [], OFFICE: []}
    delivery = await rig.start()
    for i in range(4):
        for chat in (FIELD, OFFICE):
            chunks = split_text(long_reply())[:2] if i == 1 else [f"update {i} for {chat}"]
            chunks = [f"{chat}/{i}: {c}" for c in chunks]
            rig.queue(chat, chunks)
            expected[chat] += chunks
        delivery.wake()
        await asyncio.sleep(0.15)
    rig.fake.fail("sendMessage", drop_connection=True, times=3)
    await asyncio.sleep(0.3)
    rig.fake.clear_failures()
    await rig.wait_sent(len(expected[FIELD]) + len(expected[OFFICE]), timeout=10)
    entries = outbox.list_entries(rig.db.conn)
    await until(lambda: rig.settled(entries))
    for chat, texts in expected.items():
        assert rig.fake.sent_texts(chat) == texts
        assert [r.text for r in rig.transcript(chat)] == texts
    assert {e.status for e in outbox.list_entries(rig.db.conn)} == {"sent"}
    assert len(rig.fake.sent()) == len(expected[FIELD]) + len(expected[OFFICE])


async def test_a_restart_between_chunks_does_not_send_a_confirmed_chunk_again(rig: Rig) -> None:
    chunks = split_text(long_reply())[:3]
    rig.fake.fail("sendMessage", status=500, when=lambda p: p.get("text") == chunks[1])
    entries = rig.queue(FIELD, chunks)
    first = await rig.start(retry_seconds=60.0, backoff_cap=300.0)  # chunk 2 fails once and waits a minute
    await rig.wait_sent(1, FIELD)
    await until(lambda: rig.entry(entries[1].id).attempts == 1)
    await first.stop()
    due = rig.entry(entries[1].id).next_attempt_at
    assert due is not None and 50 < (due - now_utc()).total_seconds() <= 60  # FARMHOST_OUTBOX_RETRY_SECONDS
    assert [e.status for e in map(rig.entry, (e.id for e in entries))] == ["sent", "pending", "pending"]

    # a new process, a minute later (the clock is moved instead of waiting)
    await rig.start(clock=lambda: now_utc() + timedelta(minutes=2))
    sent = await rig.wait_sent(3, FIELD)
    assert [c.text for c in sent] == chunks
    await until(lambda: rig.settled(entries))
    await asyncio.sleep(0.1)
    assert rig.fake.sent_texts(FIELD) == chunks
    assert [r.text for r in rig.transcript(FIELD)] == chunks


async def test_photos_and_documents_go_with_their_bytes_and_caption(rig: Rig) -> None:
    photo = rig.queue_file(FIELD, "field.png", PNG, "North field **now**")
    report = rig.queue_file(FIELD, "report.csv", b"day,mm\n1,4\n", "")
    big = rig.queue_file(FIELD, "huge.jpg", b"\xff\xd8" + b"\0" * (10 * 1024 * 1024), "too big for a photo")
    await rig.start()
    first, second, third = await rig.wait_sent(3, FIELD, timeout=10)
    assert first.method == "sendPhoto" and first.files["photo"] == PNG and first.file_names["photo"] == "field.png"
    assert first.text == "North field <b>now</b>" and first.params["parse_mode"] == "HTML"
    assert first.result["caption"] == "North field now"
    assert second.method == "sendDocument" and second.files["document"] == b"day,mm\n1,4\n"
    assert second.file_names["document"] == "report.csv" and "caption" not in second.params
    assert third.method == "sendDocument" and third.file_names["document"] == "huge.jpg"
    done = await until(lambda: rig.settled([photo, report, big]))
    assert {e.status for e in done} == {"sent"}
    assert [r.text for r in rig.transcript(FIELD)] == [
        "[photo field.png] North field **now**",
        "[document report.csv]",
        "[document huge.jpg] too big for a photo",
    ]
    assert not any((rig.layout.outbox_files / "main").iterdir())  # the private copies are gone once sent


async def test_a_photo_telegram_cannot_process_goes_as_a_document(rig: Rig) -> None:
    rig.fake.fail("sendPhoto", status=400, description="Bad Request: PHOTO_INVALID_DIMENSIONS")
    entry = rig.queue_file(FIELD, "panorama.png", PNG)
    gone = rig.queue_file(OFFICE, "gone.png", PNG, "lost")
    Path(gone.file_path or "").unlink()
    await rig.start()
    (call,) = await rig.wait_sent(1, FIELD)
    assert call.method == "sendDocument" and call.files["document"] == PNG
    done, lost = await until(lambda: rig.settled([entry, gone]))
    assert done.status == "sent" and done.options["send_as"] == "document"
    assert lost.status == "failed" and "cannot read the file to send" in (lost.last_error or "")


async def test_an_inline_keyboard_goes_with_the_last_chunk(rig: Rig) -> None:
    entries = rig.queue(OFFICE, ["New chat **Barn** wants to talk.", "Approve it?"], options={"reply_markup": KEYBOARD})
    (broken,) = rig.queue(FIELD, ["bad keyboard"], options={"reply_markup": {"keyboard": "nope"}})
    await rig.start()
    first, second = await rig.wait_sent(2, OFFICE)
    assert "reply_markup" not in first.params
    assert second.params["reply_markup"] == KEYBOARD and second.result["reply_markup"] == KEYBOARD
    (failed,) = await until(lambda: rig.settled([broken]))
    assert failed.status == "failed" and "not a valid inline keyboard" in (failed.last_error or "")
    assert rig.fake.sent(FIELD) == []
    done = await until(lambda: rig.settled(entries))
    assert done[1].telegram_message_id == second.result["message_id"]


async def test_an_unreachable_api_never_uses_up_the_attempts(tmp_path: Path) -> None:
    root = tmp_path / "data"
    DataLayout(root).create()
    db = Database.open(root)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=root,
        telegram_bot_token="1:x",
        telegram_api_base_url="http://127.0.0.1:9",
        outbox_max_attempts=2,
        outbox_retry_seconds=0.01,
    )
    telegram = build_config(settings).telegram
    bot = make_bot(telegram)
    delivery = OutboxDelivery(db=db, settings=telegram, layout=DataLayout(root), bot=bot, backoff_cap=0.05)
    with db.tx() as conn:
        outbox.enqueue(conn, message_key="k", chat_jid="telegram:1", source_folder=None, chunks=["hi"], at=now_utc())
    await delivery.start()
    try:
        await until(lambda: (outbox.get_entry(db.conn, 1) or _never()).last_error)
        await asyncio.sleep(0.3)  # several more tries, none counted
        entry = outbox.get_entry(db.conn, 1)
        assert entry is not None and entry.status == "pending" and entry.attempts == 0
        assert "Telegram unreachable" in (entry.last_error or "")
    finally:
        await delivery.stop()
        await bot.shutdown()
        db.close()


def _never() -> OutboxEntry:
    raise AssertionError("the entry vanished")
