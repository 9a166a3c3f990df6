"""TelegramInbound end to end: the fake Bot API -> PTB -> routing, storage, offsets, agent runs and replies."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from inbound_support import (
    FIELD_CHAT,
    MAIN_CHAT,
    calls,
    new_data_dir,
    prompts,
    running,
    settings_for,
    until,
    wait_sent,
)
from telegram_stub import FakeTelegram

MAIN, FIELD = f"telegram:{MAIN_CHAT}", f"telegram:{FIELD_CHAT}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return new_data_dir(tmp_path)


async def test_a_main_chat_message_runs_the_agent_and_the_reply_reaches_the_chat(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True) as host:
        update = tg.user_message(MAIN_CHAT, "is the pump on? sleep=0.8", title="Farm office")
        [reply] = await wait_sent(tg, 1, MAIN_CHAT)
        uid = update["update_id"]
        await until(lambda: (row := host.update(uid)) is not None and row["status"] == "done", what="done")
        seen = prompts(root, "main")
        transcript = await until(lambda: len(t := host.transcript(MAIN)) == 2 and t, what="reply in the transcript")
        offset = host.offset()
        typing = calls(tg, "sendChatAction")
    assert [(p["groupFolder"], p["contextMode"], p["scheduled"], p["chatJid"]) for p in seen] == [
        ("main", "group", False, MAIN)
    ]
    assert seen[0]["prompt"].endswith("@ana: is the pump on? sleep=0.8")
    assert reply.text == "echo: " + seen[0]["prompt"].splitlines()[-1]
    assert transcript[0] == ("in", "@ana", "is the pump on? sleep=0.8")
    assert transcript[1][0] == "out" and transcript[1][2] == reply.text  # written by the delivery
    assert offset == uid + 1
    assert uid + 1 in tg.offsets  # Telegram was told: the update is confirmed
    assert typing and all(c.params == {"chat_id": MAIN_CHAT, "action": "typing"} for c in typing)
    assert len(typing) >= 2  # repeated while the 0.8 s run went on (every 0.3 s in this test)
    assert {c.method for c in tg.calls} >= {"getMe", "deleteWebhook", "setMyCommands", "getUpdates"}


async def test_untriggered_messages_are_context_for_the_next_triggered_one(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg)) as host:
        tg.user_message(FIELD_CHAT, "the east tank looks low", first_name="Ben", username=None, title="Field crew")
        tg.user_message(FIELD_CHAT, "/status@some_other_bot", title="Field crew")
        tg.user_message(FIELD_CHAT, "and the gate is open", user_id=43, username="carla")
        first = tg.user_message(FIELD_CHAT, "@field can you check both?")
        await until(lambda: (row := host.update(first["update_id"])) is not None and row["status"] == "done")
        tg.user_message(FIELD_CHAT, "thanks!")
        second = tg.user_message(FIELD_CHAT, "hey @FARM_TEST_BOT, and now?")
        await until(lambda: (row := host.update(second["update_id"])) is not None and row["status"] == "done")
        replies = [json.loads(r["options"] or "{}") for r in host.outbox(FIELD)]
        bodies = [r["body"] for r in host.outbox(FIELD)]
        stored = host.rows("SELECT status FROM telegram_updates ORDER BY update_id")
    runs = prompts(root, "field")
    assert len(runs) == 2
    lines = runs[0]["prompt"].splitlines()
    assert lines[0].startswith("Earlier messages in this chat")
    assert lines[1].startswith("[20") and lines[1].endswith("] Ben: the east tank looks low")
    assert lines[2].endswith("] @ana: /status@some_other_bot")  # another bot's command is just text here
    assert lines[3].endswith("] @carla: and the gate is open")
    assert lines[-2] == "The message for you:" and lines[-1].endswith("] @ana: @field can you check both?")
    second_lines = runs[1]["prompt"].splitlines()
    assert [line.split("] ", 1)[1] for line in second_lines if line.startswith("[")] == [
        "@ana: thanks!",
        "@ana: hey @FARM_TEST_BOT, and now?",
    ]
    assert bodies == [f"echo: {lines[-1]}", f"echo: {second_lines[-1]}"] and replies == [{}, {}]
    assert [r["status"] for r in stored] == ["stored", "stored", "stored", "done", "stored", "done"]


async def test_a_redelivered_update_is_dropped_and_a_restart_resumes_at_the_committed_offset(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg)
    async with running(settings) as host:
        first = tg.user_message(FIELD_CHAT, "note one")
        await until(lambda: host.offset() == first["update_id"] + 1, what="offset")
        await until(lambda: tg.offsets[-1] == first["update_id"] + 1, what="the next poll, with the new offset")
    assert tg.offsets[-1] == first["update_id"] + 1
    polls_before = len(tg.offsets)
    tg.redeliver(first["update_id"])
    second = tg.user_message(FIELD_CHAT, "note two")
    async with running(settings) as host:
        await until(lambda: host.offset() == second["update_id"] + 1, what="second stored")
        transcript = host.transcript(FIELD)
        statuses = host.rows("SELECT update_id, status FROM telegram_updates ORDER BY update_id")
    assert tg.offsets[polls_before] == first["update_id"] + 1  # the new inbound started from the stored offset
    assert transcript == [("in", "@ana", "note one"), ("in", "@ana", "note two")]
    assert [(r[0], r[1]) for r in statuses] == [(first["update_id"], "stored"), (second["update_id"], "stored")]


async def test_a_restart_between_receiving_and_replying_runs_the_message_once(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg)
    # The runtime is down (as when farmhost stops right after storing): the run cannot start.
    async with running(settings, start_runtime=False) as host:
        update = tg.user_message(MAIN_CHAT, "water the greenhouse")
        uid = update["update_id"]
        await until(lambda: (row := host.update(uid)) is not None and json.loads(row["detail"])["attempts"] == 1)
        assert host.update(uid)["status"] == "queued" and host.outbox() == []
    async with running(settings) as host:
        await until(lambda: (row := host.update(uid)) is not None and row["status"] == "done", what="rerun")
        replies = [r["body"] for r in host.outbox(MAIN)]
    polls = len(tg.offsets)
    async with running(settings) as host:  # a third start has nothing left to run
        await until(lambda: len(tg.offsets) > polls, what="polling")
        assert host.update(uid)["status"] == "done"
    seen = prompts(root, "main")
    assert len(seen) == 1 and seen[0]["prompt"].endswith("@ana: water the greenhouse")
    assert replies == [f"echo: {seen[0]['prompt'].splitlines()[-1]}"]


async def test_a_run_cut_short_by_a_stop_runs_again_once_after_the_restart(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg)
    async with running(settings) as host:
        uid = tg.user_message(MAIN_CHAT, "a long job sleep-once=30")["update_id"]
        await until(lambda: len(prompts(root, "main")) == 1, what="the agent started")
    # stopped in the app's order: the inbound, then the runtime (which ended the agent)
    async with running(settings, deliver=True) as host:
        assert host.update(uid)["status"] in ("queued", "done") and host.outbox() == []
        [reply] = await wait_sent(tg, 1, MAIN_CHAT)
        await until(lambda: host.update(uid)["status"] == "done", what="done")
        replies = host.outbox(MAIN)
    first, second = prompts(root, "main")
    assert first["prompt"] == second["prompt"] and first["runId"] != second["runId"]
    assert len(replies) == 1 and reply.text == f"echo: {second['prompt'].splitlines()[-1]}"


async def test_a_run_interrupted_twice_is_given_up_with_a_message(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg)
    async with running(settings, start_runtime=False) as host:
        uid = tg.user_message(MAIN_CHAT, "count the sheep")["update_id"]
        await until(lambda: (row := host.update(uid)) is not None and json.loads(row["detail"])["attempts"] == 1)
    async with running(settings, start_runtime=False) as host:
        await until(lambda: json.loads(host.update(uid)["detail"])["attempts"] == 2, what="second attempt")
    async with running(settings) as host:
        await until(lambda: host.update(uid)["status"] == "failed", what="given up")
        [notice] = host.outbox(MAIN)
    assert prompts(root, "main") == []
    assert notice["body"] == "I couldn't finish that: farmhost restarted while I was working on it. Please ask again."


async def test_a_failed_run_sends_one_short_human_message(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg), deliver=True) as host:
        uid = tg.user_message(MAIN_CHAT, "please fail")["update_id"]
        [sent] = await wait_sent(tg, 1, MAIN_CHAT)
        await until(lambda: host.update(uid)["status"] == "failed")
    assert sent.text == "I couldn't finish that: the pump controller is offline"
    assert "Traceback" not in (sent.text or "")


async def test_main_chat_sender_allowlist(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg, FARMHOST_TELEGRAM_MAIN_SENDERS="42, 7")) as host:
        stranger = tg.user_message(MAIN_CHAT, "open all valves", user_id=99, username="mallory")
        owner = tg.user_message(MAIN_CHAT, "what's up?", user_id=42)
        await until(lambda: (row := host.update(owner["update_id"])) is not None and row["status"] == "done")
        refused = host.update(stranger["update_id"])
        transcript = host.transcript(MAIN)
    assert refused["status"] == "ignored" and "99" in refused["detail"]
    assert transcript == [("in", "@ana", "what's up?")]
    assert len(prompts(root, "main")) == 1


async def test_an_edit_is_stored_as_context_and_never_starts_a_run(root: Path, fake_telegram: FakeTelegram) -> None:
    tg = fake_telegram
    async with running(settings_for(root, tg)) as host:
        original = tg.user_message(FIELD_CHAT, "water the beans")
        message = dict(original["message"], text="@field water the beans", edit_date=original["message"]["date"] + 5)
        with tg._cond:  # the fake has no builder for edits: queue the update the way its builders do
            edit = tg._queue_update("edited_message", message)
        trigger = tg.user_message(FIELD_CHAT, "@field done?")
        await until(lambda: (row := host.update(trigger["update_id"])) is not None and row["status"] == "done")
        edit_row = host.update(edit["update_id"])
    [run] = prompts(root, "field")
    context = [line.split("] ", 1)[1] for line in run["prompt"].splitlines() if line.startswith("[")]
    assert context == ["@ana: water the beans", "@ana: (edited) @field water the beans", "@ana: @field done?"]
    assert edit_row["status"] == "stored"


# PTB 22 warns (an error under pytest) when it builds a RetryAfter unless PTB_TIMEDELTA is set.
@pytest.mark.filterwarnings("ignore::telegram.warnings.PTBDeprecationWarning")
async def test_polling_survives_outages_and_loses_nothing(
    root: Path, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="farmhost.telegram.inbound.receiver")
    tg = fake_telegram
    tg.fail("getUpdates", status=502, description="Bad Gateway", times=2)
    tg.fail("getUpdates", drop_connection=True)
    tg.fail("getUpdates", status=409, description="Conflict: terminated by other getUpdates request")
    tg.fail("getUpdates", status=429, retry_after=1)
    tg.user_message(FIELD_CHAT, "sent during the outage")
    second = tg.user_message(FIELD_CHAT, "and another one")
    async with running(settings_for(root, tg)) as host:
        await until(lambda: host.offset() == second["update_id"] + 1, what="recovered")
        # The host stores its offset before it confirms it to Telegram with the next getUpdates.
        await until(lambda: tg.offsets[-1:] == [second["update_id"] + 1], what="offset confirmed to Telegram")
        assert host.inbound.polling
        transcript = host.transcript(FIELD)
    assert [t[2] for t in transcript] == ["sent during the outage", "and another one"]
    polls = calls(tg, "getUpdates")
    assert [c.status for c in polls[:6]] == [502, 502, 0, 409, 429, 200]
    assert polls[5].at - polls[4].at >= 0.9  # Telegram's retry_after (1 s) was honoured
    assert polls[5].params.get("offset") is None and tg.offsets[-1] == second["update_id"] + 1
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "farmhost.telegram.inbound.receiver" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1 and "getUpdates failed: NetworkError: Bad Gateway" in warnings[0]  # logged once
    assert any("polling works again after 5 failed attempt(s)" in r.getMessage() for r in caplog.records)


async def test_a_refused_token_stops_polling_with_a_clear_reason(
    root: Path, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    tg = fake_telegram
    settings = settings_for(root, tg, TELEGRAM_BOT_TOKEN="999:WRONG-TOKEN")
    async with running(settings) as host:
        await until(lambda: not host.inbound.polling, what="polling stopped")
        reason = host.inbound.stopped_reason
    assert reason is not None and "TELEGRAM_BOT_TOKEN" in reason
    assert any("TELEGRAM_BOT_TOKEN" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


async def test_an_update_ptb_cannot_read_is_skipped_and_the_rest_is_processed(
    root: Path, fake_telegram: FakeTelegram
) -> None:
    tg = fake_telegram
    tg.user_message(FIELD_CHAT, "before")
    with tg._cond:  # something Telegram would never send: the fake's update queue takes it as it is
        bad = tg._queue_update("message", {"message_id": 99, "date": 0, "chat": "not a chat"})
    after = tg.user_message(FIELD_CHAT, "after")
    async with running(settings_for(root, tg)) as host:
        await until(lambda: host.offset() == after["update_id"] + 1, what="the batch processed")
        row = host.update(bad["update_id"])
        transcript = host.transcript(FIELD)
        assert host.inbound.polling
    assert row["status"] == "error" and row["detail"].startswith("unreadable update: ")
    assert [t[2] for t in transcript] == ["before", "after"]
