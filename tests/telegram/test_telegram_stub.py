"""The fake Bot API (tests/telegram_stub.py) driven by the real python-telegram-bot client."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dtm
from collections.abc import AsyncIterator

import httpx
import pytest
import telegram
from farmhost_testing import scaled, wait_for_async
from telegram.error import BadRequest, Conflict, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram_stub import FakeTelegram, parse_html

GROUP = -1001234


def make_bot(fake: FakeTelegram, token: str | None = None) -> telegram.Bot:
    return telegram.Bot(token or fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url)


@pytest.fixture
async def bot(fake_telegram: FakeTelegram) -> AsyncIterator[telegram.Bot]:
    async with make_bot(fake_telegram) as client:
        yield client


# identity and transport -------------------------------------------------------------------------------


async def test_get_me_is_the_bot(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    me = await bot.get_me()
    assert (me.id, me.is_bot, me.username) == (fake_telegram.bot_id, True, "farm_test_bot")
    assert me.can_join_groups is True
    assert fake_telegram.wait_calls("getMe")[0].ok


async def test_wrong_token_is_invalid(fake_telegram: FakeTelegram) -> None:
    with pytest.raises(InvalidToken):
        async with make_bot(fake_telegram, token="999:WRONG"):
            pass


def test_raw_http_shapes(fake_telegram: FakeTelegram) -> None:
    root = f"{fake_telegram.api_root}/bot{fake_telegram.token}"
    with httpx.Client() as http:
        assert http.get(f"{root}/getMe").json()["result"]["username"] == "farm_test_bot"
        assert http.get(f"{root}/GETME").json()["ok"] is True  # method names are case-insensitive
        wrong = http.get(f"{fake_telegram.api_root}/bot1:nope/getMe")
        assert (wrong.status_code, wrong.json()) == (
            401,
            {"ok": False, "error_code": 401, "description": "Unauthorized"},
        )
        unknown = http.post(f"{root}/launchRockets")
        assert (unknown.status_code, unknown.json()["description"]) == (404, "Not Found")
        as_json = http.post(f"{root}/sendMessage", json={"chat_id": GROUP, "text": "json"}).json()
        as_form = http.post(f"{root}/sendMessage", data={"chat_id": str(GROUP), "text": "form"}).json()
        as_query = http.get(f"{root}/sendMessage", params={"chat_id": GROUP, "text": "query"}).json()
        assert [r["result"]["message_id"] for r in (as_json, as_form, as_query)] == [1, 2, 3]
        assert http.get(f"{fake_telegram.api_root}/file/bot{fake_telegram.token}/nothing/here").status_code == 404
    assert fake_telegram.sent_texts(GROUP) == ["json", "form", "query"]
    assert {call.chat_id for call in fake_telegram.sent()} == {GROUP}  # form values normalised to int


# inbound ---------------------------------------------------------------------------------------------------


async def test_long_poll_returns_when_a_message_arrives(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    before = fake_telegram.polls_started()
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await wait_for_async(lambda: fake_telegram.polls_started() > before, what="the long poll to reach the fake")
    assert not poll.done()
    queued = fake_telegram.user_message(GROUP, "/status@farm_test_bot now, @ana", user_id=7, username="bob")
    [update] = await asyncio.wait_for(poll, scaled(5))
    assert update.update_id == queued["update_id"]
    message = update.message
    assert message is not None and message.from_user is not None
    assert (message.chat.id, message.chat.type, message.chat.title) == (GROUP, "group", "Farm")
    assert (message.from_user.id, message.from_user.username, message.from_user.is_bot) == (7, "bob", False)
    assert message.text == "/status@farm_test_bot now, @ana"
    assert [(e.type, e.offset, e.length) for e in message.entities] == [("bot_command", 0, 21), ("mention", 27, 4)]


async def test_long_poll_times_out_empty(bot: telegram.Bot) -> None:
    assert await bot.get_updates(timeout=1) == ()


async def test_offset_confirms_and_limit_pages(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    ids = [fake_telegram.user_message(GROUP, f"m{n}")["update_id"] for n in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [u.update_id for u in await bot.get_updates(limit=2)] == ids[:2]
    assert [u.update_id for u in await bot.get_updates()] == ids  # not confirmed: delivered again
    assert [u.update_id for u in await bot.get_updates(offset=ids[1])] == ids[1:]
    assert await bot.get_updates(offset=ids[2] + 1) == ()
    assert fake_telegram.offsets == [None, None, ids[1], ids[2] + 1]
    assert fake_telegram.pending_updates() == []
    fake_telegram.wait_confirmed(ids[2], timeout=1)
    later = fake_telegram.user_message(GROUP, "later")["update_id"]
    assert later > ids[2]


async def test_redeliver_gives_a_duplicate(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    first = fake_telegram.user_message(GROUP, "once")["update_id"]
    [update] = await bot.get_updates()
    assert await bot.get_updates(offset=first + 1) == ()
    fake_telegram.redeliver(first)
    [again] = await bot.get_updates(offset=first + 1, timeout=2)
    assert again.update_id == first and again.message is not None and again.message.text == "once"
    assert again.to_dict() == update.to_dict()


async def test_allowed_updates_filter(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    fake_telegram.callback_query(GROUP, 1, "x")
    wanted = fake_telegram.user_message(GROUP, "hi")["update_id"]
    assert [u.update_id for u in await bot.get_updates(allowed_updates=["message"])] == [wanted]


async def test_private_chat_and_reply(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    first = fake_telegram.user_message(42, "hello", chat_type="private")
    fake_telegram.user_message(42, "again", chat_type="private", reply_to_message_id=first["message"]["message_id"])
    one, two = await bot.get_updates()
    assert one.message is not None and one.message.chat.type == "private" and one.message.chat.first_name == "Ana"
    assert two.message is not None and two.message.reply_to_message is not None
    assert two.message.reply_to_message.text == "hello"


async def test_second_poller_ends_the_first_with_conflict(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    before = fake_telegram.polls_started()
    first = asyncio.create_task(bot.get_updates(timeout=30))
    await wait_for_async(lambda: fake_telegram.polls_started() > before, what="the first long poll to reach the fake")
    async with make_bot(fake_telegram) as other:
        await other.get_updates(timeout=0)
    with pytest.raises(Conflict, match="terminated by other getUpdates request"):
        await asyncio.wait_for(first, scaled(5))


async def test_close_ends_a_waiting_long_poll(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    before = fake_telegram.polls_started()
    poll = asyncio.create_task(bot.get_updates(timeout=30))
    await wait_for_async(lambda: fake_telegram.polls_started() > before, what="the long poll to reach the fake")
    await asyncio.to_thread(fake_telegram.close)
    with contextlib.suppress(NetworkError):  # the answer may lose the race with the closed socket
        assert await asyncio.wait_for(poll, scaled(5)) == ()


# outbound text ---------------------------------------------------------------------------------------


async def test_send_message_html_keyboard_and_record(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    keyboard = telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton("Approve", callback_data="ok:1")]])
    sent = await bot.send_message(
        GROUP, "  <b>Pump</b> is &lt;on&gt; 😀 <i>now</i>\n", parse_mode="HTML", reply_markup=keyboard
    )
    assert sent.text == "Pump is <on> 😀 now"
    assert [(e.type, e.offset, e.length) for e in sent.entities] == [("bold", 0, 4), ("italic", 16, 3)]
    assert sent.reply_markup == keyboard
    assert sent.from_user is not None and sent.from_user.id == fake_telegram.bot_id
    [call] = fake_telegram.wait_sent(1, chat_id=GROUP, timeout=1)
    assert call.method == "sendMessage" and call.params["parse_mode"] == "HTML"
    assert call.params["reply_markup"] == keyboard.to_dict()
    assert call.result["message_id"] == sent.message_id
    assert fake_telegram.messages(GROUP)[-1]["text"] == "Pump is <on> 😀 now"
    chat_action = await bot.send_chat_action(GROUP, "typing")
    assert chat_action is True and fake_telegram.wait_calls("sendChatAction")[0].params["action"] == "typing"


@pytest.mark.parametrize(
    ("html", "error"),
    [
        ("<x>hi</x>", 'Unsupported start tag "x" at byte offset 0'),
        ("if a < b", 'Unsupported start tag "" at byte offset 5'),
        ("é <bold>", 'Unsupported start tag "bold" at byte offset 3'),
        ("<b>bold", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<b><i>x</b></i>", 'Unmatched end tag at byte offset 7, expected "</i>", found "</b>"'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        ("<span>x</span>", 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
        ("<b", "Unclosed start tag at byte offset 0"),
    ],
)
async def test_broken_html_is_a_bad_request(
    fake_telegram: FakeTelegram, bot: telegram.Bot, html: str, error: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        await bot.send_message(GROUP, html, parse_mode="HTML")
    assert caught.value.message.lower() == f"can't parse entities: {error}".lower()
    [call] = fake_telegram.wait_calls("sendMessage", timeout=1)
    assert call.status == 400 and call.response is not None
    assert call.response["description"] == f"Bad Request: can't parse entities: {error}"
    assert fake_telegram.sent() == []


def test_every_supported_html_tag() -> None:
    text, entities = parse_html(
        "<b>b</b><strong>s</strong><i>i</i><em>e</em><u>u</u><ins>n</ins><s>s</s><strike>k</strike><del>d</del>"
        '<span class="tg-spoiler">p</span><tg-spoiler>q</tg-spoiler><a href="https://x.org/?a=1&amp;b=2">a</a>'
        '<code>c</code><pre>p</pre><pre><code class="language-python">x = 1</code></pre>'
        "<blockquote>q</blockquote><blockquote expandable>e</blockquote>&quot;&amp;&#33;&#x41;&nbsp;"
    )
    assert text == 'bsieunskdpqacpx = 1qe"&!A&nbsp;'
    assert [e["type"] for e in entities] == [
        *["bold"] * 2,
        *["italic"] * 2,
        *["underline"] * 2,
        *["strikethrough"] * 3,
        *["spoiler"] * 2,
        "text_link",
        "code",
        "pre",
        "pre",
        "blockquote",
        "expandable_blockquote",
    ]
    link = next(e for e in entities if e["type"] == "text_link")
    assert link["url"] == "https://x.org/?a=1&b=2"
    assert next(e for e in entities if e.get("language")) == {
        "type": "pre",
        "offset": 14,
        "length": 5,
        "language": "python",
    }


async def test_length_and_empty_text(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    with pytest.raises(BadRequest, match="Message is too long"):
        await bot.send_message(GROUP, "a" * 4097)
    with pytest.raises(BadRequest, match="Message is too long"):
        await bot.send_message(GROUP, "😀" * 2049)  # 4098 UTF-16 units
    with pytest.raises(BadRequest, match="Message text is empty"):
        await bot.send_message(GROUP, " \n ")
    with pytest.raises(BadRequest, match="Message text is empty"):
        await bot.send_message(GROUP, "<b> </b>", parse_mode="HTML")
    await bot.send_message(GROUP, "a" * 4096)
    await bot.send_message(GROUP, "<b>" + "a" * 4096 + "</b>", parse_mode="HTML")  # counted after parsing
    assert len(fake_telegram.sent(GROUP)) == 2


async def test_chat_validation(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    fake_telegram.unknown_chats.add(-5)
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.send_message(-5, "hi")
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.send_message("@nobody", "hi")
    assert (await bot.send_message(777, "never seen")).chat.type == "private"
    with pytest.raises(BadRequest, match="Message to be replied not found"):
        await bot.send_message(GROUP, "re", reply_to_message_id=99)
    with pytest.raises(BadRequest, match="Button_data_invalid"):
        markup = telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton("x", callback_data="y" * 65)]])
        await bot.send_message(GROUP, "too much data", reply_markup=markup)


async def test_edit_message(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    keyboard = telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton("Yes", callback_data="y")]])
    sent = await bot.send_message(GROUP, "Approve?", reply_markup=keyboard)
    edited = await bot.edit_message_text("Approved", chat_id=GROUP, message_id=sent.message_id)
    assert isinstance(edited, telegram.Message)
    assert (edited.text, edited.reply_markup, edited.message_id) == ("Approved", None, sent.message_id)
    with pytest.raises(BadRequest, match="Message is not modified"):
        await bot.edit_message_text("Approved", chat_id=GROUP, message_id=sent.message_id)
    relabelled = await bot.edit_message_reply_markup(GROUP, sent.message_id, reply_markup=keyboard)
    assert isinstance(relabelled, telegram.Message) and relabelled.reply_markup == keyboard
    with pytest.raises(BadRequest, match="Message to edit not found"):
        await bot.edit_message_text("x", chat_id=GROUP, message_id=999)
    users = fake_telegram.user_message(GROUP, "mine")["message"]["message_id"]
    with pytest.raises(BadRequest, match="Message can't be edited"):
        await bot.edit_message_text("x", chat_id=GROUP, message_id=users)
    assert len(fake_telegram.sent()) == 1  # edits are not sends


async def test_set_my_commands_and_delete_webhook(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    assert await bot.set_my_commands([("status", "Farm status"), ("help", "What I can do")]) is True
    assert [c["command"] for c in fake_telegram.commands] == ["status", "help"]
    assert [c.command for c in await bot.get_my_commands()] == ["status", "help"]
    with pytest.raises(BadRequest, match="Bot_command_invalid"):
        await bot.set_my_commands([("Status!", "bad")])
    assert await bot.delete_webhook() is True


# files ---------------------------------------------------------------------------------------------------


async def test_send_photo_and_document_bytes(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    picture, report = b"\x89PNG\r\n\x1a\n" + bytes(range(256)), b"col\x00\xff\n" * 100
    photo = await bot.send_photo(GROUP, picture, caption="<b>Field</b> 3", parse_mode="HTML")
    document = await bot.send_document(GROUP, report, filename="report.csv", caption="weekly")
    assert photo.caption == "Field 3" and photo.caption_entities[0].type == "bold"
    assert document.document is not None and document.document.file_name == "report.csv"
    assert document.document.mime_type == "text/csv" and document.document.file_size == len(report)
    photo_call, document_call = fake_telegram.wait_sent(2, chat_id=GROUP, timeout=1)
    assert photo_call.files == {"photo": picture} and document_call.files == {"document": report}
    assert document_call.file_names == {"document": "report.csv"}
    assert fake_telegram.file_content(photo.photo[-1].file_id) == picture
    downloaded = await (await bot.get_file(document.document.file_id)).download_as_bytearray()
    assert bytes(downloaded) == report
    with pytest.raises(BadRequest, match="File must be non-empty"):
        await bot.send_document(GROUP, b"", filename="empty.txt")
    with pytest.raises(BadRequest, match="Message caption is too long"):
        await bot.send_photo(GROUP, picture, caption="c" * 1025)
    reused = await bot.send_photo(GROUP, photo.photo[-1].file_id)
    assert reused.photo[-1].file_id == photo.photo[-1].file_id


async def test_media_messages_download(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    fake_telegram.media_message(GROUP, "photo", content=b"jpeg-bytes" * 10, caption="look @farm_test_bot")
    fake_telegram.media_message(GROUP, "document", content=b"%PDF-1.7", file_name="soil.pdf")
    fake_telegram.media_message(GROUP, "voice", content=b"OggS....")
    fake_telegram.media_message(GROUP, "location", latitude=51.5, longitude=-0.1)
    fake_telegram.media_message(GROUP, "document", content=b"small", file_name="huge.iso", declared_size=30 << 20)
    photo, document, voice, location, huge = [u.message for u in await bot.get_updates()]
    assert photo is not None and photo.caption == "look @farm_test_bot"
    assert [(e.type, e.offset) for e in photo.caption_entities] == [("mention", 5)]
    assert len(photo.photo) == 2 and photo.photo[-1].width > photo.photo[0].width
    assert bytes(await (await photo.photo[-1].get_file()).download_as_bytearray()) == b"jpeg-bytes" * 10
    assert document is not None and document.document is not None
    assert (document.document.file_name, document.document.mime_type) == ("soil.pdf", "application/pdf")
    assert bytes(await (await document.document.get_file()).download_as_bytearray()) == b"%PDF-1.7"
    assert voice is not None and voice.voice is not None and voice.voice.mime_type == "audio/ogg"
    assert bytes(await (await voice.voice.get_file()).download_as_bytearray()) == b"OggS...."
    assert location is not None and location.location is not None
    assert (location.location.latitude, location.location.longitude) == (51.5, -0.1)
    assert huge is not None and huge.document is not None and huge.document.file_size == 30 << 20
    with pytest.raises(BadRequest, match="File is too big"):
        await huge.document.get_file()
    with pytest.raises(BadRequest, match="Invalid file_id"):
        await bot.get_file("nope")


# callbacks --------------------------------------------------------------------------------------------------


async def test_callback_query_and_answer(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    keyboard = telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton("Approve", callback_data="approve:7")]])
    asked = await bot.send_message(GROUP, "Register chat 7?", reply_markup=keyboard)
    fake_telegram.callback_query(GROUP, asked.message_id, "approve:7", user_id=5, username="boss")
    [update] = await bot.get_updates()
    query = update.callback_query
    assert query is not None and isinstance(query.message, telegram.Message)
    assert (query.data, query.from_user.id, query.from_user.username) == ("approve:7", 5, "boss")
    assert query.message.message_id == asked.message_id and query.message.reply_markup == keyboard
    assert query.chat_instance
    assert await bot.answer_callback_query(query.id, text="Approved") is True
    with pytest.raises(BadRequest, match="Query is too old"):
        await bot.answer_callback_query(query.id)
    assert fake_telegram.wait_calls("answerCallbackQuery", 2)[0].params["text"] == "Approved"


async def test_get_chat_member_answers_the_members_set_and_user_not_found_for_anyone_else(
    fake_telegram: FakeTelegram, bot: telegram.Bot
) -> None:
    statuses = ("creator", "administrator", "member", "restricted", "left", "kicked")
    for user_id, status in enumerate(statuses, start=1):
        fake_telegram.set_member(GROUP, user_id, status, is_member=False, first_name=f"U{user_id}")
    found = [await bot.get_chat_member(GROUP, user_id) for user_id in range(1, len(statuses) + 1)]
    assert [type(m).__name__ for m in found] == [
        "ChatMemberOwner", "ChatMemberAdministrator", "ChatMemberMember", "ChatMemberRestricted", "ChatMemberLeft",
        "ChatMemberBanned",
    ]  # fmt: skip
    assert [m.user.id for m in found] == [1, 2, 3, 4, 5, 6] and found[0].user.first_name == "U1"
    assert isinstance(found[3], telegram.ChatMemberRestricted) and found[3].is_member is False
    assert (await bot.get_chat_member(GROUP, fake_telegram.bot_id)).status == "administrator"
    assert (await bot.get_chat_member(777, 777)).status == "member"  # a private chat: the user it is with
    for chat_id, user_id in ((GROUP, 99), (777, 42)):
        with pytest.raises(BadRequest, match="User not found"):
            await bot.get_chat_member(chat_id, user_id)
    fake_telegram.unknown_chats.add(-5)
    with pytest.raises(BadRequest, match="Chat not found"):
        await bot.get_chat_member(-5, 1)
    assert [c.status for c in fake_telegram.calls if c.method == "getChatMember"][-3:] == [400, 400, 400]


# failures -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "description", "error"),
    [
        (400, "Bad Request: chat not found", BadRequest),
        (401, "Unauthorized", InvalidToken),
        (403, "Forbidden: bot was blocked by the user", Forbidden),
        (500, "Internal Server Error", NetworkError),
        (502, "Bad Gateway", NetworkError),
    ],
)
async def test_injected_failures(
    fake_telegram: FakeTelegram, bot: telegram.Bot, status: int, description: str, error: type[TelegramError]
) -> None:
    fake_telegram.fail("sendMessage", status=status, description=description)
    with pytest.raises(error) as caught:
        await bot.send_message(GROUP, "first")
    assert type(caught.value) is error
    await bot.send_message(GROUP, "second")
    failed, ok = fake_telegram.wait_calls("sendMessage", 2, timeout=1)
    assert failed.status == status and failed.response == {
        "ok": False,
        "error_code": status,
        "description": description,
    }
    assert ok.ok and fake_telegram.sent_texts() == ["second"]


async def test_retry_after(fake_telegram: FakeTelegram, bot: telegram.Bot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTB_TIMEDELTA", "true")  # PTB 22 warns when retry_after is read as an int
    fake_telegram.fail("sendMessage", status=429, retry_after=7, times=2)
    for _ in range(2):
        with pytest.raises(RetryAfter) as caught:
            await bot.send_message(GROUP, "flood")
        assert caught.value.retry_after == dtm.timedelta(seconds=7)
    assert fake_telegram.wait_calls("sendMessage", timeout=1)[0].response == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 7",
        "parameters": {"retry_after": 7},
    }
    await bot.send_message(GROUP, "flood")
    assert len(fake_telegram.sent()) == 1


async def test_dropped_connection(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    fake_telegram.fail("sendPhoto", drop_connection=True)
    with pytest.raises(NetworkError):
        await bot.send_photo(GROUP, b"img")
    [dropped] = fake_telegram.wait_calls("sendPhoto", timeout=1)
    assert (dropped.method, dropped.status, dropped.response, dropped.files) == (
        "sendPhoto",
        0,
        None,
        {"photo": b"img"},
    )
    await bot.send_photo(GROUP, b"img")
    assert len(fake_telegram.sent()) == 1


async def test_failure_matching_and_clearing(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    fake_telegram.fail(
        "sendMessage", status=502, description="Bad Gateway", times=5, when=lambda p: p["chat_id"] == GROUP
    )
    await bot.send_message(-200, "other chat is fine")
    for _ in range(2):
        with pytest.raises(NetworkError):
            await bot.send_message(GROUP, "down")
    fake_telegram.clear_failures()
    await bot.send_message(GROUP, "back")
    assert fake_telegram.sent_texts() == ["other chat is fine", "back"]


async def test_failed_get_updates_confirms_nothing(fake_telegram: FakeTelegram, bot: telegram.Bot) -> None:
    update_id = fake_telegram.user_message(GROUP, "keep me")["update_id"]
    fake_telegram.fail("getUpdates", status=500)
    with pytest.raises(NetworkError):
        await bot.get_updates(offset=update_id + 1)
    assert fake_telegram.offsets == [] and [u["update_id"] for u in fake_telegram.pending_updates()] == [update_id]
    assert [u.update_id for u in await bot.get_updates()] == [update_id]
