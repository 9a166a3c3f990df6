"""A fake Telegram Bot API server for tests (the stand-in for api.telegram.org).

A real HTTP server (`http.server.ThreadingHTTPServer` in a thread) on 127.0.0.1 speaking the Bot API over
HTTP, so python-telegram-bot (or any other client) is exercised unchanged: give PTB
`base_url=fake.base_url` (`<api_root>/bot`) and `base_file_url=fake.base_file_url` (`<api_root>/file/bot`);
farmhost gets `TELEGRAM_API_BASE_URL=fake.api_root`.

Endpoints:
    GET|POST /bot<token>/<method>        a Bot API method; parameters from the query string and from an
                                         application/x-www-form-urlencoded, application/json or
                                         multipart/form-data body (PTB sends form data, multipart for uploads).
                                         Method names are case-insensitive, as on Telegram.
    GET /file/bot<token>/<file_path>     the bytes of a file (`file_path` from getFile)
    anything else                        404 `{"ok": false, "error_code": 404, "description": "Not Found"}`
A wrong token answers 401 `{"ok": false, "error_code": 401, "description": "Unauthorized"}`; an unknown method
404 "Not Found". Answers are `{"ok": true, "result": ...}` or `{"ok": false, "error_code": n, "description":
"...", "parameters": {...}}` with the HTTP status equal to `error_code`.

Methods (real response shapes: User, Update, Message, CallbackQuery, File, Chat):
    getMe                    the bot's User (id from the token, is_bot, username, can_join_groups ...)
    getUpdates               long poll: `timeout` seconds (capped at 50; fractions allowed) until an update
                             is queued (wakes at once); `offset` confirms and forgets every update with a
                             smaller id (a negative one keeps only the last -offset), `limit` (1..100),
                             `allowed_updates` (filters by update type). A second getUpdates while one is
                             waiting ends the first with 409 "Conflict: terminated by other getUpdates
                             request ...", as Telegram does. Only calls not failed by fail() are in `offsets`.
    sendMessage              -> Message. `text` required ("message text is empty" when missing or blank after
                             parsing), at most 4096 UTF-16 units after parsing ("message is too long");
                             `parse_mode` HTML is parsed like Telegram (tdlib) does: tags b strong i em u ins
                             s strike del span class="tg-spoiler" tg-spoiler a href code (class="language-x")
                             pre blockquote (expandable) tg-emoji, entities &lt; &gt; &amp; &quot; and numeric
                             ones; errors "can't parse entities: Unsupported start tag "x" at byte offset N",
                             "Unmatched end tag at byte offset N, expected "</i>", found "</b>"",
                             "Can't find end tag corresponding to start tag "b"", ... . MarkdownV2 / Markdown
                             are accepted but NOT parsed (the text is stored as sent, with no entities).
                             `entities` (without parse_mode) are echoed. Leading/trailing whitespace is
                             trimmed from the stored text, as Telegram does.
    sendPhoto, sendDocument  -> Message with photo[] (two PhotoSizes) / document{}; the file is an upload
                             (multipart, also `attach://name`), a known file_id, or an http(s) URL (not
                             fetched). `caption` + parse_mode as above, at most 1024 ("message caption is
                             too long"); an empty upload -> "file must be non-empty"; > 50 MB -> 413.
    sendChatAction           -> true (the action must be one of Telegram's)
    editMessageText          -> the edited Message ("message to edit not found", "message can't be edited"
                             for a user's message, "there is no text in the message to edit",
                             "message is not modified: ..."); without reply_markup the keyboard is removed.
    editMessageReplyMarkup   -> the edited Message (same errors)
    answerCallbackQuery      -> true ("query is too old and response timeout expired or query ID is invalid"
                             for an unknown or already answered id)
    setMyCommands            -> true (command `^[a-z0-9_]{1,32}$` else "BOT_COMMAND_INVALID"); getMyCommands
    deleteWebhook            -> true (`drop_pending_updates` forgets the queue); getWebhookInfo
    getFile                  -> File (file_id, file_unique_id, file_size, file_path); "invalid file_id";
                             "file is too big" over 20 MB (the declared size counts)
    getChat                  -> the Chat
    getChatMember            -> the ChatMember of `user_id` in `chat_id`, as set by set_member(); in a private chat
                             its own user is a "member", and the bot is an "administrator" everywhere; anyone else
                             answers 400 "Bad Request: user not found", as Telegram does for a user not in the chat
Every send validates `chat_id` ("chat_id is empty"; "chat not found" for a non-numeric id or one in
`fake.unknown_chats`); a chat never seen is otherwise accepted (a group for negative ids, a private chat for
positive ones). `reply_markup` with `inline_keyboard` is validated (callback_data 1..64 bytes, else
"BUTTON_DATA_INVALID") and echoed in the Message; other markups are accepted and not echoed, as Telegram does.
`reply_parameters` / `reply_to_message_id` must name a message of the chat ("message to be replied not
found") unless allow_sending_without_reply. Form values are normalised in `Call.params`: ids/offsets/limits
to int, JSON fields (reply_markup, entities, allowed_updates, commands, reply_parameters ...) decoded,
booleans to bool; everything else stays a string.

Usage:
    with FakeTelegram() as tg:                 # or the pytest fixture `fake_telegram` (a started FakeTelegram)
        bot = telegram.Bot(tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url)
        tg.user_message(-100, "hello @farm_test_bot")          # queued for getUpdates
        ...
        [call] = tg.wait_sent(1, chat_id=-100)
        assert call.params["text"] == "..." and call.result["message_id"] == 2

Inbound (each returns the Update dict that getUpdates will deliver; update_id increases from 10001):
    user_message(chat_id, text, *, user_id=42, first_name="Ana", username="ana", chat_type="group",
                 title="Farm", entities=None, reply_to_message_id=None)
        chat_type group|supergroup|private|channel (a channel gives a `channel_post`). With entities=None the
        server finds bot_command, mention and url entities itself (UTF-16 offsets); pass [] for none.
        reply_to_message_id must name a message of that chat (KeyError otherwise).
    media_message(chat_id, kind "photo"|"document"|"voice"|"location", *, caption=None, content=b"...",
                  file_name=None, mime_type=None, declared_size=None, latitude=52.37, longitude=4.89, ...)
        the file is downloadable through getFile + /file/; `declared_size` makes the Message and File claim
        another size (e.g. a hostile 1 GB). A photo has two sizes: a thumbnail (the first quarter of the
        bytes) and the full `content` (photo[-1]).
    callback_query(chat_id, message_id, data, *, user_id=42, ...)   a button press on a stored message
    redeliver(update_id)     deliver an already delivered (even confirmed) update once more, whatever the offset
Members (what getChatMember answers):
    set_member(chat_id, user_id, status="member", *, is_member=True, first_name="Member", username=None)
        status creator|administrator|member|restricted|left|kicked; `is_member` only for restricted
    pending_updates()        queued updates not yet confirmed by an offset

Records (thread-safe; read them as lists, they are copied):
    calls: list[Call]        every method call, in completion order: Call(method, params, files, at,
                             response, status) with `ok`, `result`, `chat_id`, `text` (text or caption),
                             `file_names`; a dropped connection has response None, status 0
    offsets                  the `offset` of every getUpdates call that fail() did not fail, in arrival order
                             (None when absent)
    sent(chat_id=None)       successful sendMessage / sendPhoto / sendDocument calls
    sent_texts(chat_id=None) their text / caption (as sent, before parsing)
    messages(chat_id)        every message of a chat (users' and the bot's), current state, by message_id
    file_content(file_id)    the bytes of a stored file (uploads included)
    commands                 the last setMyCommands list;  downloads: file paths fetched through /file/
    wait_sent(count, chat_id=None, timeout=10), wait_calls(method, count=1, timeout=10),
    wait_confirmed(update_id, timeout=10)      block until true, else AssertionError saying what was seen

Failures: `fail(method, *, status=500, description="Internal Server Error", retry_after=None, times=1,
drop_connection=False, when=None, migrate_to_chat_id=None)` makes the next `times` calls of `method` that
match `when(params)` fail before they have any effect (nothing sent, no offset confirmed): 429 with
`retry_after` carries `parameters.retry_after` (PTB raises RetryAfter), 400 -> BadRequest, 401/404 ->
InvalidToken, 403 -> Forbidden, 409 -> Conflict, 5xx -> NetworkError; `drop_connection=True` closes the socket
without an answer (PTB raises NetworkError). Failed calls are in `calls` with their response, never in
`sent()`. Rules apply in the order given; `clear_failures()` removes the remaining ones (an outage that ends).

`close()` stops the server, ends waiting long polls and closes every open connection.
"""

from __future__ import annotations

import contextlib
import copy
import email.message
import itertools
import json
import mimetypes
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from farmhost_testing import scaled

TEXT_LIMIT = 4096
CAPTION_LIMIT = 1024
DOWNLOAD_LIMIT = 20 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
MAX_POLL_TIMEOUT = 50.0
FIRST_UPDATE_ID = 10001
SEND_METHODS = frozenset({"sendMessage", "sendPhoto", "sendDocument"})
CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)
UPDATE_TYPES = ("message", "edited_message", "channel_post", "callback_query", "my_chat_member", "chat_member")
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same "
    "as a current content and reply markup of the message"
)
QUERY_INVALID = "Bad Request: query is too old and response timeout expired or query ID is invalid"

_INT_FIELDS = frozenset(
    {
        "chat_id",
        "message_id",
        "offset",
        "limit",
        "timeout",
        "reply_to_message_id",
        "message_thread_id",
        "from_chat_id",
        "user_id",
        "cache_time",
        "duration",
        "width",
        "height",
    }
)
_BOOL_FIELDS = frozenset(
    {
        "disable_notification",
        "protect_content",
        "show_alert",
        "drop_pending_updates",
        "allow_sending_without_reply",
        "disable_web_page_preview",
        "has_spoiler",
        "disable_content_type_detection",
        "allow_paid_broadcast",
        "show_caption_above_media",
    }
)
_JSON_FIELDS = frozenset(
    {
        "reply_markup",
        "entities",
        "caption_entities",
        "allowed_updates",
        "commands",
        "reply_parameters",
        "link_preview_options",
        "scope",
        "media",
    }
)


class ApiError(Exception):
    """A Bot API error answer (`{"ok": false, ...}`); raised inside method handlers."""

    def __init__(self, status: int, description: str, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def document(self) -> dict[str, Any]:
        """The JSON answer."""
        body: dict[str, Any] = {"ok": False, "error_code": self.status, "description": self.description}
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def _bad(description: str) -> ApiError:
    return ApiError(400, f"Bad Request: {description}")


@dataclass
class Call:
    """One Bot API method call as the fake received and answered it."""

    method: str
    params: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    at: float = 0.0
    response: dict[str, Any] | None = None
    status: int = 200
    file_names: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the call was answered `{"ok": true}`."""
        return self.response is not None and self.response.get("ok") is True

    @property
    def result(self) -> Any:
        """The answer's `result` (None for a failed call)."""
        return self.response.get("result") if self.response is not None else None

    @property
    def chat_id(self) -> Any:
        """The `chat_id` parameter (an int for numeric ids)."""
        return self.params.get("chat_id")

    @property
    def text(self) -> str | None:
        """The `text` or `caption` parameter, as sent."""
        value = self.params.get("text", self.params.get("caption"))
        return value if isinstance(value, str) else None


@dataclass
class _Failure:
    method: str
    status: int
    description: str
    retry_after: int | None
    times: int
    drop_connection: bool
    when: Callable[[dict[str, Any]], bool] | None
    migrate_to_chat_id: int | None

    def document(self) -> dict[str, Any]:
        parameters: dict[str, Any] = {}
        if self.retry_after is not None:
            parameters["retry_after"] = self.retry_after
        if self.migrate_to_chat_id is not None:
            parameters["migrate_to_chat_id"] = self.migrate_to_chat_id
        return ApiError(self.status, self.description, parameters or None).document()


@dataclass
class _StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    content: bytes
    size: int


@dataclass
class _Upload:
    content: bytes
    filename: str | None
    content_type: str | None


@dataclass
class _Request:
    """What a handler thread hands to `FakeTelegram.dispatch`."""

    token: str
    method: str
    params: dict[str, Any]
    uploads: dict[str, _Upload]


_Answer = tuple[int, dict[str, Any]] | None  # None: drop the connection


def utf16_len(text: str) -> int:
    """The length of `text` in UTF-16 code units (how Telegram counts)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class FakeTelegram:
    """The fake Bot API server. Start it with `with` (or `start()` / `close()`)."""

    def __init__(
        self,
        *,
        token: str = "123456:TEST-TOKEN",
        username: str = "farm_test_bot",
        first_name: str = "Farm Test Bot",
        unknown_chats: Iterable[int] = (),
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.token = token
        self.tls = tls  # serve HTTPS with this server context (its certificate for 127.0.0.1)
        self.username = username
        self.first_name = first_name
        head = token.split(":", 1)[0]
        self.bot_id = int(head) if head.isdigit() else 123456
        self.unknown_chats: set[int] = set(unknown_chats)
        self.commands: list[dict[str, Any]] = []
        self.offsets: list[int | None] = []
        self.downloads: list[str] = []
        self._calls: list[Call] = []
        self._cond = threading.Condition()
        self._closed = False
        self._queue: list[dict[str, Any]] = []  # not yet confirmed, by update_id
        self._redelivered: list[dict[str, Any]] = []
        self._updates: dict[int, dict[str, Any]] = {}  # every update ever queued
        self._update_ids = itertools.count(FIRST_UPDATE_ID)
        self._allowed: set[str] | None = None
        self._poll_generation = 0
        self._chats: dict[int, dict[str, Any]] = {}
        self._next_message_id: dict[int, int] = {}
        self._messages: dict[tuple[int, int], dict[str, Any]] = {}
        self._files: dict[str, _StoredFile] = {}
        self._file_ids = itertools.count(1)
        self._callbacks: dict[str, bool] = {}  # query id -> answered
        self._members: dict[int, dict[int, dict[str, Any]]] = {}  # chat id -> user id -> ChatMember
        self._migrated: dict[int, int] = {}  # a group's id -> the supergroup it became
        self._callback_ids = itertools.count(7000000000000000001)
        self._failures: list[_Failure] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._methods: dict[str, tuple[str, Callable[[_Request], Any]]] = {
            name.lower(): (name, handler)
            for name, handler in {
                "getMe": self._get_me,
                "getUpdates": self._get_updates,
                "sendMessage": self._send_message,
                "sendPhoto": self._send_photo,
                "sendDocument": self._send_document,
                "sendChatAction": self._send_chat_action,
                "editMessageText": self._edit_message_text,
                "editMessageReplyMarkup": self._edit_message_reply_markup,
                "answerCallbackQuery": self._answer_callback_query,
                "setMyCommands": self._set_my_commands,
                "getMyCommands": self._get_my_commands,
                "deleteWebhook": self._delete_webhook,
                "getWebhookInfo": self._get_webhook_info,
                "getFile": self._get_file,
                "getChat": self._get_chat,
                "getChatMember": self._get_chat_member,
            }.items()
        }

    # lifecycle -----------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind 127.0.0.1 on a free port and serve in a background thread."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        if self.tls is not None:  # a client that refuses the certificate fails in accept(): an OSError it skips
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="telegram-stub", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: end waiting long polls, close open connections, release the port."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._cond:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def api_root(self) -> str:
        """`http://127.0.0.1:<port>` (`https://` with `tls`): farmhost's TELEGRAM_API_BASE_URL."""
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls is not None else 'http'}://{host!s}:{port}"

    @property
    def base_url(self) -> str:
        """PTB's `base_url`: `<api_root>/bot`."""
        return f"{self.api_root}/bot"

    @property
    def base_file_url(self) -> str:
        """PTB's `base_file_url`: `<api_root>/file/bot`."""
        return f"{self.api_root}/file/bot"

    # inbound -------------------------------------------------------------------------------------

    def user_message(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int = 42,
        first_name: str = "Ana",
        username: str | None = "ana",
        chat_type: str = "group",
        title: str | None = "Farm",
        entities: list[dict[str, Any]] | None = None,
        reply_to_message_id: int | None = None,
    ) -> dict[str, Any]:
        """Queue a text message from a user; returns the Update."""
        content: dict[str, Any] = {"text": text}
        found = _find_entities(text) if entities is None else entities
        if found:
            content["entities"] = found
        return self._user_update(chat_id, content, user_id, first_name, username, chat_type, title, reply_to_message_id)

    def media_message(
        self,
        chat_id: int,
        kind: Literal["photo", "document", "voice", "audio", "video_note", "location"],
        *,
        caption: str | None = None,
        duration: int = 3,
        content: bytes = b"fake media bytes",
        file_name: str | None = None,
        mime_type: str | None = None,
        declared_size: int | None = None,
        latitude: float = 52.37,
        longitude: float = 4.89,
        user_id: int = 42,
        first_name: str = "Ana",
        username: str | None = "ana",
        chat_type: str = "group",
        title: str | None = "Farm",
        caption_entities: list[dict[str, Any]] | None = None,
        reply_to_message_id: int | None = None,
    ) -> dict[str, Any]:
        """Queue a photo / document / voice / audio / video note / location message; returns the Update."""
        with self._cond:
            body: dict[str, Any] = {}
            if kind == "photo":
                body["photo"] = self._photo_sizes(content, declared_size)
            elif kind == "document":
                name = file_name or "file.bin"
                mime = mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
                stored = self._store_file("documents", name, content, declared_size)
                body["document"] = {"file_name": name, "mime_type": mime, **_file_ref(stored)}
            elif kind == "voice":
                stored = self._store_file("voice", "voice.oga", content, declared_size)
                body["voice"] = {"duration": duration, "mime_type": mime_type or "audio/ogg", **_file_ref(stored)}
            elif kind == "audio":
                name = file_name or "audio.mp3"
                stored = self._store_file("music", name, content, declared_size)
                body["audio"] = {"duration": duration, "mime_type": mime_type or "audio/mpeg", "file_name": name,
                                 **_file_ref(stored)}  # fmt: skip
            elif kind == "video_note":
                stored = self._store_file("video_notes", "video_note.mp4", content, declared_size)
                body["video_note"] = {"duration": duration, "length": 240, **_file_ref(stored)}
            elif kind == "location":
                body["location"] = {"latitude": latitude, "longitude": longitude}
            else:
                raise ValueError(f"unknown media kind {kind!r}")
        if caption is not None:
            body["caption"] = caption
            found = _find_entities(caption) if caption_entities is None else caption_entities
            if found:
                body["caption_entities"] = found
        return self._user_update(chat_id, body, user_id, first_name, username, chat_type, title, reply_to_message_id)

    def callback_query(
        self,
        chat_id: int,
        message_id: int,
        data: str,
        *,
        user_id: int = 42,
        first_name: str = "Ana",
        username: str | None = "ana",
    ) -> dict[str, Any]:
        """Queue a press on an inline button of message `message_id`; returns the Update."""
        with self._cond:
            message = self._messages.get((chat_id, message_id))
            if message is None:  # a message the fake never saw: a minimal one from the bot
                message = {
                    "message_id": message_id,
                    "date": int(time.time()),
                    "chat": self._chat(chat_id),
                    "from": self._bot_user(),
                    "text": "",
                }
            query_id = str(next(self._callback_ids))
            self._callbacks[query_id] = False
            query = {
                "id": query_id,
                "from": _user(user_id, first_name, username),
                "message": copy.deepcopy(message),
                "chat_instance": str(abs(chat_id) * 7919 + 13),
                "data": data,
            }
            return self._queue_update("callback_query", query)

    def set_member(
        self,
        chat_id: int,
        user_id: int,
        status: Literal["creator", "administrator", "member", "restricted", "left", "kicked"] = "member",
        *,
        is_member: bool = True,
        first_name: str = "Member",
        username: str | None = None,
    ) -> None:
        """Make getChatMember answer `status` for this user in this chat (`is_member`: for restricted only)."""
        with self._cond:
            self._members.setdefault(chat_id, {})[user_id] = _chat_member(
                _user(user_id, first_name, username), status, is_member=is_member
            )

    def migrate(
        self, chat_id: int, supergroup_id: int, *, from_first: bool = False, user_id: int = 42, title: str = "Farm"
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Upgrade group `chat_id` to supergroup `supergroup_id`, as Telegram does; returns the two Updates.

        The old group gets a service message with `migrate_to_chat_id`, the supergroup one with
        `migrate_from_chat_id` (`from_first`: that one is queued first; Telegram promises no order). From then
        on a send to the old id is refused with 400 and `migrate_to_chat_id`, as Telegram answers.
        """
        with self._cond:
            user = _user(user_id, "Ana", "ana")
            old = {"id": chat_id, "type": "group", "title": title}
            new = {"id": supergroup_id, "type": "supergroup", "title": title}
            self._chats[chat_id], self._chats[supergroup_id] = old, new
            self._migrated[chat_id] = supergroup_id
            to = self._new_message(old, user, {"migrate_to_chat_id": supergroup_id})
            back = self._new_message(new, user, {"migrate_from_chat_id": chat_id})
            if from_first:
                from_update = self._queue_update("message", back)
                return self._queue_update("message", to), from_update
            return self._queue_update("message", to), self._queue_update("message", back)

    def redeliver(self, update_id: int) -> None:
        """Deliver an already delivered update once more (the client sees a duplicate), whatever its offset."""
        with self._cond:
            if update_id not in self._updates:
                raise KeyError(f"no update {update_id}")
            self._redelivered.append(copy.deepcopy(self._updates[update_id]))
            self._cond.notify_all()

    def pending_updates(self) -> list[dict[str, Any]]:
        """Queued updates that no getUpdates offset has confirmed yet."""
        with self._cond:
            return copy.deepcopy(self._queue + self._redelivered)

    # records ----------------------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Every method call so far, in completion order (a copy of the list)."""
        with self._cond:
            return list(self._calls)

    def polls_started(self) -> int:
        """How many getUpdates calls have reached the fake so far (a long poll counts as soon as it waits)."""
        with self._cond:
            return self._poll_generation

    def sent(self, chat_id: int | None = None) -> list[Call]:
        """Successful sendMessage / sendPhoto / sendDocument calls (to `chat_id`, if given)."""
        with self._cond:
            return [
                call
                for call in self._calls
                if call.method in SEND_METHODS and call.ok and (chat_id is None or call.result["chat"]["id"] == chat_id)
            ]

    def sent_texts(self, chat_id: int | None = None) -> list[str]:
        """The text / caption parameter of every successful send (as sent, before parsing)."""
        return [call.text or "" for call in self.sent(chat_id)]

    def messages(self, chat_id: int) -> list[dict[str, Any]]:
        """Every message of a chat (users' and the bot's) in its current state, by message_id."""
        with self._cond:
            found = [msg for (chat, _), msg in self._messages.items() if chat == chat_id]
            return copy.deepcopy(sorted(found, key=lambda msg: msg["message_id"]))

    def file_content(self, file_id: str) -> bytes:
        """The bytes of a stored file (a user's media or an upload)."""
        with self._cond:
            return self._files[file_id].content

    def wait_sent(self, count: int, chat_id: int | None = None, timeout: float = 10) -> list[Call]:
        """Block until at least `count` sends succeeded (to `chat_id`, if given); returns them all."""
        return self._wait(lambda: self.sent(chat_id), count, timeout, f"sends to {chat_id}")

    def wait_calls(self, method: str, count: int = 1, timeout: float = 10) -> list[Call]:
        """Block until `method` was called (answered, failed or not) at least `count` times; returns those calls."""

        def matching() -> list[Call]:
            return [call for call in self._calls if call.method.lower() == method.lower()]

        return self._wait(matching, count, timeout, f"{method} calls")

    def wait_confirmed(self, update_id: int, timeout: float = 10) -> None:
        """Block until a getUpdates call confirmed `update_id` (came with an offset above it; `timeout` scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        with self._cond:
            while not any(offset is not None and offset > update_id for offset in self.offsets):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"update {update_id} was never confirmed; offsets seen: {self.offsets}")
                self._cond.wait(left)

    def _wait(self, found: Callable[[], list[Call]], count: int, timeout: float, what: str) -> list[Call]:
        deadline = time.monotonic() + scaled(timeout)
        with self._cond:
            while len(calls := found()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(call.method, call.status, call.params) for call in self._calls[-20:]]
                    raise AssertionError(f"expected {count} {what}, got {len(calls)}; last calls: {seen}")
                self._cond.wait(left)
            return calls

    # failures --------------------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        *,
        status: int = 500,
        description: str = "Internal Server Error",
        retry_after: int | None = None,
        times: int = 1,
        drop_connection: bool = False,
        when: Callable[[dict[str, Any]], bool] | None = None,
        migrate_to_chat_id: int | None = None,
    ) -> None:
        """Make the next `times` calls of `method` (whose params match `when`, if given) fail, without effect."""
        if times < 1:
            raise ValueError("times must be at least 1")
        if status == 429 and retry_after is None:
            retry_after = 1
        if status == 429 and description == "Internal Server Error":
            description = f"Too Many Requests: retry after {retry_after}"
        rule = _Failure(
            method.lower(), status, description, retry_after, times, drop_connection, when, migrate_to_chat_id
        )
        with self._cond:
            self._failures.append(rule)

    def clear_failures(self) -> None:
        """Forget every failure rule not used up yet."""
        with self._cond:
            self._failures.clear()

    def _take_failure(self, method: str, params: dict[str, Any]) -> _Failure | None:
        for rule in self._failures:
            if rule.method == method.lower() and (rule.when is None or rule.when(params)):
                rule.times -= 1
                if rule.times <= 0:
                    self._failures.remove(rule)
                return rule
        return None

    # dispatch --------------------------------------------------------------------------------------

    def dispatch(self, request: _Request) -> _Answer:
        """Answer one method call and record it; None means: drop the connection."""
        call = Call(
            method=request.method,
            params=request.params,
            files={name: upload.content for name, upload in request.uploads.items()},
            at=time.time(),
            file_names={name: up.filename for name, up in request.uploads.items() if up.filename is not None},
        )
        answer = self._answer(request, call)
        with self._cond:
            call.status, call.response = answer if answer is not None else (0, None)
            self._calls.append(call)
            self._cond.notify_all()
        return answer

    def _answer(self, request: _Request, call: Call) -> _Answer:
        if request.token != self.token:
            return 401, ApiError(401, "Unauthorized").document()
        known = self._methods.get(request.method.lower())
        if known is None:
            return 404, ApiError(404, "Not Found").document()
        call.method, handler = known
        try:
            call.params = request.params = _normalise(request.params)
        except ApiError as err:
            return err.status, err.document()
        with self._cond:
            rule = self._take_failure(call.method, call.params)
            if rule is not None:
                return None if rule.drop_connection else (rule.status, rule.document())
            if call.method == "getUpdates":
                self.offsets.append(call.params.get("offset"))
                self._cond.notify_all()
            try:
                result = handler(request)
            except ApiError as err:
                return err.status, err.document()
            return 200, {"ok": True, "result": copy.deepcopy(result)}

    def download(self, token: str, file_path: str) -> tuple[int, bytes, str]:
        """Answer GET /file/bot<token>/<file_path>: status, body, content type."""
        with self._cond:
            if token != self.token:
                return 401, json.dumps(ApiError(401, "Unauthorized").document()).encode(), "application/json"
            for stored in self._files.values():
                if stored.file_path == file_path:
                    self.downloads.append(file_path)
                    self._cond.notify_all()
                    return 200, stored.content, "application/octet-stream"
            return 404, json.dumps(ApiError(404, "Not Found").document()).encode(), "application/json"

    def track(self, conn: socket.socket, *, add: bool) -> None:
        """Remember an open connection (so close() can end it)."""
        with self._cond:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    # methods (called with the lock held) ----------------------------------------------------------

    def _get_me(self, request: _Request) -> dict[str, Any]:
        return {
            **self._bot_user(),
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    def _get_updates(self, request: _Request) -> list[dict[str, Any]]:
        params = request.params
        offset = params.get("offset")
        limit = min(max(_int(params.get("limit", 100), "limit"), 1), 100)
        timeout = min(max(_seconds(params.get("timeout", 0)), 0.0), MAX_POLL_TIMEOUT)
        allowed = params.get("allowed_updates")
        if isinstance(allowed, list):
            self._allowed = {str(kind) for kind in allowed} or None
        self._poll_generation += 1
        generation = self._poll_generation
        self._cond.notify_all()  # ends an older waiting poll with 409
        if offset is not None:
            self._confirm(_int(offset, "offset"))
        deadline = time.monotonic() + timeout
        while True:
            batch = self._take(limit)
            left = deadline - time.monotonic()
            if batch or self._closed or left <= 0:
                return batch
            self._cond.wait(left)
            if generation != self._poll_generation:
                raise ApiError(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                )

    def _confirm(self, offset: int) -> None:
        if offset < 0:
            self._queue = self._queue[len(self._queue) + offset :] if -offset < len(self._queue) else self._queue
        else:
            self._queue = [update for update in self._queue if update["update_id"] >= offset]

    def _take(self, limit: int) -> list[dict[str, Any]]:
        if self._allowed is not None:
            allowed = self._allowed
            self._queue = [update for update in self._queue if _update_type(update) in allowed]
        batch = self._redelivered[:limit]
        del self._redelivered[: len(batch)]
        return batch + self._queue[: limit - len(batch)]

    def _send_message(self, request: _Request) -> dict[str, Any]:
        params = request.params
        chat = self._target_chat(params)
        text, entities = _formatted(params.get("text"), params.get("parse_mode"), params.get("entities"))
        if not text:
            raise _bad("message text is empty")
        if utf16_len(text) > TEXT_LIMIT:
            raise _bad("message is too long")
        content: dict[str, Any] = {"text": text}
        if entities:
            content["entities"] = entities
        return self._bot_message(chat, content, params)

    def _send_photo(self, request: _Request) -> dict[str, Any]:
        chat = self._target_chat(request.params)
        content = self._caption(request.params)
        upload = self._input_file(request, "photo")
        if isinstance(upload, _StoredFile):
            stored = upload
            content["photo"] = [self._photo_size(stored, 1280, 960)]
        else:
            content["photo"] = self._photo_sizes(upload.content, None)
        return self._bot_message(chat, content, request.params)

    def _send_document(self, request: _Request) -> dict[str, Any]:
        chat = self._target_chat(request.params)
        content = self._caption(request.params)
        upload = self._input_file(request, "document")
        if isinstance(upload, _StoredFile):
            stored, name, mime = upload, upload.file_path.rsplit("/", 1)[-1], None
        else:
            name = upload.filename or "file"
            mime = upload.content_type
            stored = self._store_file("documents", name, upload.content, None)
        mime = mime or mimetypes.guess_type(name)[0] or "application/octet-stream"
        content["document"] = {"file_name": name, "mime_type": mime, **_file_ref(stored)}
        return self._bot_message(chat, content, request.params)

    def _send_chat_action(self, request: _Request) -> bool:
        self._target_chat(request.params)
        if request.params.get("action") not in CHAT_ACTIONS:
            raise _bad("wrong parameter action in request")
        return True

    def _edit_message_text(self, request: _Request) -> dict[str, Any]:
        params = request.params
        message = self._message_to_edit(params)
        if "text" not in message:
            raise _bad("there is no text in the message to edit")
        text, entities = _formatted(params.get("text"), params.get("parse_mode"), params.get("entities"))
        if not text:
            raise _bad("message text is empty")
        if utf16_len(text) > TEXT_LIMIT:
            raise _bad("message is too long")
        markup = _inline_markup(params.get("reply_markup"))
        if (
            text == message["text"]
            and entities == message.get("entities", [])
            and markup == message.get("reply_markup")
        ):
            raise ApiError(400, NOT_MODIFIED)
        message["text"] = text
        message.pop("entities", None)
        if entities:
            message["entities"] = entities
        return self._edited(message, markup)

    def _edit_message_reply_markup(self, request: _Request) -> dict[str, Any]:
        message = self._message_to_edit(request.params)
        markup = _inline_markup(request.params.get("reply_markup"))
        if markup == message.get("reply_markup"):
            raise ApiError(400, NOT_MODIFIED)
        return self._edited(message, markup)

    def _answer_callback_query(self, request: _Request) -> bool:
        query_id = str(request.params.get("callback_query_id", ""))
        if self._callbacks.get(query_id, True):
            raise ApiError(400, QUERY_INVALID)
        self._callbacks[query_id] = True
        return True

    def _set_my_commands(self, request: _Request) -> bool:
        commands = request.params.get("commands")
        if not isinstance(commands, list):
            raise _bad('parameter "commands" is required')
        for command in commands:
            name = command.get("command") if isinstance(command, dict) else None
            if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]{1,32}", name):
                raise _bad("BOT_COMMAND_INVALID")
            description = command.get("description")
            if not isinstance(description, str) or not 1 <= len(description) <= 256:
                raise _bad("BOT_COMMAND_DESCRIPTION_INVALID")
        self.commands = copy.deepcopy(commands)
        return True

    def _get_my_commands(self, request: _Request) -> list[dict[str, Any]]:
        return self.commands

    def _delete_webhook(self, request: _Request) -> bool:
        if request.params.get("drop_pending_updates"):
            self._queue.clear()
        return True

    def _get_webhook_info(self, request: _Request) -> dict[str, Any]:
        return {"url": "", "has_custom_certificate": False, "pending_update_count": len(self._queue)}

    def _get_file(self, request: _Request) -> dict[str, Any]:
        stored = self._files.get(str(request.params.get("file_id", "")))
        if stored is None:
            raise _bad("invalid file_id")
        if stored.size > DOWNLOAD_LIMIT:
            raise _bad("file is too big")
        return {**_file_ref(stored), "file_path": stored.file_path}

    def _get_chat(self, request: _Request) -> dict[str, Any]:
        return {**self._target_chat(request.params), "accent_color_id": 0, "max_reaction_count": 11}

    def _get_chat_member(self, request: _Request) -> dict[str, Any]:
        chat = self._target_chat(request.params)
        user_id = request.params.get("user_id")
        if not isinstance(user_id, int):
            raise _bad("invalid user_id specified")
        member = self._members.get(chat["id"], {}).get(user_id)
        if member is not None:
            return member
        if user_id == self.bot_id:
            return _chat_member(self._bot_user(), "administrator")
        if chat["type"] == "private" and user_id == chat["id"]:
            return _chat_member(_user(user_id, chat.get("first_name", "User"), chat.get("username")), "member")
        raise _bad("user not found")

    # helpers (lock held) ---------------------------------------------------------------------------

    def _bot_user(self) -> dict[str, Any]:
        return {"id": self.bot_id, "is_bot": True, "first_name": self.first_name, "username": self.username}

    def _chat(self, chat_id: int) -> dict[str, Any]:
        if chat_id not in self._chats:
            if chat_id < 0:
                kind = "supergroup" if str(chat_id).startswith("-100") else "group"
                self._chats[chat_id] = {"id": chat_id, "type": kind, "title": f"Chat {chat_id}"}
            else:
                self._chats[chat_id] = {"id": chat_id, "type": "private", "first_name": f"User {chat_id}"}
        return self._chats[chat_id]

    def _target_chat(self, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = params.get("chat_id")
        if chat_id is None or chat_id == "":
            raise _bad("chat_id is empty")
        if not isinstance(chat_id, int) or chat_id in self.unknown_chats:
            raise _bad("chat not found")
        if chat_id in self._migrated:
            parameters = {"migrate_to_chat_id": self._migrated[chat_id]}
            raise ApiError(400, "Bad Request: group chat was upgraded to a supergroup chat", parameters)
        return self._chat(chat_id)

    def _new_message(
        self, chat: dict[str, Any], sender: dict[str, Any] | None, content: dict[str, Any]
    ) -> dict[str, Any]:
        chat_id = chat["id"]
        message_id = self._next_message_id.get(chat_id, 1)
        self._next_message_id[chat_id] = message_id + 1
        message: dict[str, Any] = {"message_id": message_id}
        if sender is not None:
            message["from"] = sender
        message.update({"date": int(time.time()), "chat": dict(chat), **content})
        self._messages[(chat_id, message_id)] = message
        return message

    def _user_update(
        self,
        chat_id: int,
        content: dict[str, Any],
        user_id: int,
        first_name: str,
        username: str | None,
        chat_type: str,
        title: str | None,
        reply_to_message_id: int | None,
    ) -> dict[str, Any]:
        with self._cond:
            user = _user(user_id, first_name, username)
            chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
            if chat_type == "private":
                chat.update({"first_name": first_name} | ({"username": username} if username else {}))
            else:
                chat["title"] = title if title is not None else f"Chat {chat_id}"
            self._chats[chat_id] = chat
            if reply_to_message_id is not None:
                replied = self._messages.get((chat_id, reply_to_message_id))
                if replied is None:
                    raise KeyError(f"no message {reply_to_message_id} in chat {chat_id}")
                content = {**content, "reply_to_message": _without_reply(replied)}
            if chat_type == "channel":
                message = self._new_message(chat, None, content)
                return self._queue_update("channel_post", message)
            message = self._new_message(chat, user, content)
            return self._queue_update("message", message)

    def _queue_update(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        update_id = next(self._update_ids)
        update: dict[str, Any] = {"update_id": update_id, kind: copy.deepcopy(payload)}
        self._updates[update_id] = update
        self._queue.append(update)
        self._cond.notify_all()
        return copy.deepcopy(update)

    def _bot_message(self, chat: dict[str, Any], content: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        markup = _inline_markup(params.get("reply_markup"))
        reply = self._replied(chat["id"], params)
        if reply is not None:
            content["reply_to_message"] = _without_reply(reply)
        if markup is not None:
            content["reply_markup"] = markup
        return self._new_message(chat, self._bot_user(), content)

    def _replied(self, chat_id: int, params: dict[str, Any]) -> dict[str, Any] | None:
        reply = params.get("reply_parameters")
        if isinstance(reply, dict):
            message_id, lenient = reply.get("message_id"), bool(reply.get("allow_sending_without_reply"))
            chat_id = reply.get("chat_id", chat_id)
        else:
            message_id, lenient = params.get("reply_to_message_id"), bool(params.get("allow_sending_without_reply"))
        if message_id is None:
            return None
        found = self._messages.get((chat_id, message_id)) if isinstance(message_id, int) else None
        if found is None and not lenient:
            raise _bad("message to be replied not found")
        return found

    def _caption(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("caption") in (None, ""):
            return {}
        text, entities = _formatted(params.get("caption"), params.get("parse_mode"), params.get("caption_entities"))
        if utf16_len(text) > CAPTION_LIMIT:
            raise _bad("message caption is too long")
        content: dict[str, Any] = {"caption": text} if text else {}
        if entities:
            content["caption_entities"] = entities
        return content

    def _input_file(self, request: _Request, name: str) -> _Upload | _StoredFile:
        value = request.params.get(name)
        if isinstance(value, str) and value.startswith("attach://"):
            upload = request.uploads.get(value.removeprefix("attach://"))
        elif isinstance(value, str) and value:
            if value in self._files:
                return self._files[value]
            if re.match(r"https?://\S+$", value):
                return self._store_file("photos" if name == "photo" else "documents", "remote", b"", None)
            raise _bad("wrong file identifier/HTTP URL specified")
        else:
            upload = request.uploads.get(name)
        if upload is None:
            raise _bad(f"there is no {name} in the request")
        if not upload.content:
            raise _bad("file must be non-empty")
        if len(upload.content) > UPLOAD_LIMIT:
            raise ApiError(413, "Request Entity Too Large")
        return upload

    def _store_file(self, folder: str, name: str, content: bytes, declared_size: int | None) -> _StoredFile:
        number = next(self._file_ids)
        suffix = name.rsplit(".", 1)[-1] if "." in name else "bin"
        stored = _StoredFile(
            file_id=f"BQACAgIAAxkBAAI{number:06d}",
            file_unique_id=f"AgAD{number:06d}",
            file_path=f"{folder}/file_{number}.{suffix}",
            content=content,
            size=declared_size if declared_size is not None else len(content),
        )
        self._files[stored.file_id] = stored
        return stored

    def _photo_sizes(self, content: bytes, declared_size: int | None) -> list[dict[str, Any]]:
        thumb = self._store_file("photos", "thumb.jpg", content[: max(1, len(content) // 4)], None)
        full = self._store_file("photos", "photo.jpg", content, declared_size)
        return [self._photo_size(thumb, 90, 67), self._photo_size(full, 1280, 960)]

    @staticmethod
    def _photo_size(stored: _StoredFile, width: int, height: int) -> dict[str, Any]:
        return {**_file_ref(stored), "width": width, "height": height}

    def _message_to_edit(self, params: dict[str, Any]) -> dict[str, Any]:
        if "inline_message_id" in params:
            raise _bad("MESSAGE_ID_INVALID")
        chat = self._target_chat(params)
        message_id = params.get("message_id")
        if message_id is None:
            raise _bad("message identifier is not specified")
        message = self._messages.get((chat["id"], message_id)) if isinstance(message_id, int) else None
        if message is None:
            raise _bad("message to edit not found")
        if message.get("from", {}).get("id") != self.bot_id:
            raise _bad("message can't be edited")
        return message

    def _edited(self, message: dict[str, Any], markup: dict[str, Any] | None) -> dict[str, Any]:
        message.pop("reply_markup", None)
        if markup is not None:
            message["reply_markup"] = markup
        message["edit_date"] = int(time.time())
        return message


# parsing ----------------------------------------------------------------------------------------------


def _user(user_id: int, first_name: str, username: str | None) -> dict[str, Any]:
    user: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": first_name}
    if username:
        user["username"] = username
    user["language_code"] = "en"
    return user


def _chat_member(user: dict[str, Any], status: str, *, is_member: bool = True) -> dict[str, Any]:
    """A ChatMember of the Bot API (every field the status's type has)."""
    member: dict[str, Any] = {"status": status, "user": user}
    if status == "creator":
        member["is_anonymous"] = False
    elif status == "administrator":
        rights = ("can_manage_chat", "can_delete_messages", "can_manage_video_chats", "can_restrict_members",
                  "can_promote_members", "can_change_info", "can_invite_users", "can_post_stories",
                  "can_edit_stories", "can_delete_stories")  # fmt: skip
        member.update({"can_be_edited": False, "is_anonymous": False, **dict.fromkeys(rights, True)})
    elif status == "restricted":
        rights = ("can_send_messages", "can_send_audios", "can_send_documents", "can_send_photos",
                  "can_send_videos", "can_send_video_notes", "can_send_voice_notes", "can_send_polls",
                  "can_send_other_messages", "can_add_web_page_previews", "can_change_info", "can_invite_users",
                  "can_pin_messages", "can_manage_topics", "can_edit_tag", "can_react_to_messages")  # fmt: skip
        member.update({"is_member": is_member, "until_date": 0, **dict.fromkeys(rights, False)})
    elif status == "kicked":
        member["until_date"] = 0
    elif status not in ("member", "left"):
        raise ValueError(f"unknown chat member status {status!r}")
    return member


def _file_ref(stored: _StoredFile) -> dict[str, Any]:
    return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": stored.size}


def _without_reply(message: dict[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value) for key, value in message.items() if key != "reply_to_message"}


def _update_type(update: dict[str, Any]) -> str:
    return next((key for key in update if key != "update_id"), "")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _bad(f"invalid {name} specified")
    try:
        return int(value)
    except ValueError:
        raise _bad(f"invalid {name} specified") from None


def _seconds(value: Any) -> float:
    """A poll timeout; fractions are accepted (Telegram truncates them) so tests can poll briefly."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _bad("invalid timeout specified") from None


def _normalise(params: dict[str, Any]) -> dict[str, Any]:
    """Form values (strings) to what they mean: ints, booleans, decoded JSON."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in _JSON_FIELDS and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                what = "reply keyboard markup" if name == "reply_markup" else name
                raise _bad(f"can't parse {what} JSON object") from None
        elif name in _INT_FIELDS and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        elif name in _BOOL_FIELDS and isinstance(value, str):
            value = value.strip().lower() in ("true", "1")
        out[name] = value
    return out


def _inline_markup(markup: Any) -> dict[str, Any] | None:
    """The inline keyboard to echo (validated), or None for no / another kind of markup."""
    if markup is None or (isinstance(markup, dict) and "inline_keyboard" not in markup):
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise _bad(
            'can\'t parse inline keyboard button: field "inline_keyboard" of the InlineKeyboardMarkup should be '
            "an Array of Arrays"
        )
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not isinstance(button.get("text"), str):
                raise _bad('can\'t parse inline keyboard button: Field "text" must be of type String')
            actions = [key for key in button if key != "text"]
            if len(actions) != 1:
                raise _bad("can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard")
            data = button.get("callback_data")
            if "callback_data" in button and (not isinstance(data, str) or not 1 <= len(data.encode()) <= 64):
                raise _bad("BUTTON_DATA_INVALID")
    return {"inline_keyboard": copy.deepcopy(rows)}


def _formatted(text: Any, parse_mode: Any, entities: Any) -> tuple[str, list[dict[str, Any]]]:
    """The stored text and entities of a text/caption: parsed per parse_mode, trimmed like Telegram does."""
    if text is None:
        return "", []
    text = str(text)
    mode = str(parse_mode or "").lower()
    if mode == "html":
        plain, found = parse_html(text)
    elif mode in ("", "markdown", "markdownv2"):
        plain, found = text, (list(entities) if isinstance(entities, list) and not mode else [])
    else:
        raise _bad("unsupported parse_mode")
    return _trim(plain, found)


def _trim(text: str, entities: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    lead = utf16_len(text) - utf16_len(text.lstrip())
    stripped = text.strip()
    end = utf16_len(stripped)
    kept = []
    for entity in entities:
        start = max(0, int(entity.get("offset", 0)) - lead)
        stop = min(end, int(entity.get("offset", 0)) + int(entity.get("length", 0)) - lead)
        if stop > start:
            kept.append({**entity, "offset": start, "length": stop - start})
    return stripped, kept


_SPACE = b" \t\r\n\0\v"
_NAMED = {b"lt": "<", b"gt": ">", b"amp": "&", b"quot": '"'}
_TAGS = frozenset(
    {"a", "b", "strong", "i", "em", "s", "strike", "del", "u", "ins", "tg-spoiler", "tg-emoji", "span", "pre"}
    | {"code", "blockquote"}
)
_SIMPLE = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
}


def _html_entity(data: bytes, i: int) -> tuple[str, int] | None:
    """Decode the HTML entity at data[i] == '&': (character, index after ';'), or None to keep the '&'."""
    j = i + 1
    if data[j : j + 1] == b"#":
        j += 1
        hexadecimal = data[j : j + 1] in (b"x", b"X")
        j += hexadecimal
        digits = b"0123456789abcdefABCDEF" if hexadecimal else b"0123456789"
        start = j
        while j < len(data) and data[j] in digits:
            j += 1
        if j == start or data[j : j + 1] != b";":
            return None
        code = int(data[start:j], 16 if hexadecimal else 10)
        if code == 0 or code >= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return None
        return chr(code), j + 1
    start = j
    while j < len(data) and chr(data[j]).isascii() and chr(data[j]).isalpha():
        j += 1
    name = data[start:j]
    if data[j : j + 1] != b";" or name not in _NAMED:
        return None
    return _NAMED[name], j + 1


def _decode_entities(data: bytes) -> str:
    out, i = [], 0
    while i < len(data):
        if data[i : i + 1] == b"&" and (decoded := _html_entity(data, i)) is not None:
            out.append(decoded[0].encode())
            i = decoded[1]
        else:
            out.append(data[i : i + 1])
            i += 1
    return b"".join(out).decode("utf-8", "replace")


class _Parser:
    """Telegram's HTML parse_mode (a port of tdlib's parse_html), errors and byte offsets included."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()
        self.result = bytearray()
        self.utf16 = 0
        self.nested: list[tuple[str, str, int]] = []  # tag, argument, utf16 offset
        self.entities: list[dict[str, Any]] = []

    def at(self, i: int) -> int:
        return self.data[i] if i < len(self.data) else 0

    def fail(self, message: str) -> ApiError:
        return _bad(f"can't parse entities: {message}")

    def parse(self) -> tuple[str, list[dict[str, Any]]]:
        i = 0
        while i < len(self.data):
            c = self.data[i]
            if c == ord("&") and (decoded := _html_entity(self.data, i)) is not None:
                self.result += decoded[0].encode()
                self.utf16 += utf16_len(decoded[0])
                i = decoded[1]
            elif c != ord("<"):
                self.result.append(c)
                if c & 0xC0 != 0x80:
                    self.utf16 += 2 if c >= 0xF0 else 1
                i += 1
            elif self.at(i + 1) == ord("/"):
                i = self.end_tag(i)
            else:
                i = self.start_tag(i)
        if self.nested:
            raise self.fail(f'Can\'t find end tag corresponding to start tag "{self.nested[-1][0]}"')
        self.entities.sort(key=lambda e: (e["offset"], -e["length"]))
        return self.result.decode(), self.entities

    def start_tag(self, begin: int) -> int:
        i = begin + 1
        while self.at(i) not in _SPACE and self.at(i) != ord(">"):
            i += 1
        if self.at(i) == 0:
            raise self.fail(f"Unclosed start tag at byte offset {begin}")
        tag = self.data[begin + 1 : i].decode("utf-8", "replace").lower()
        if tag not in _TAGS:
            raise self.fail(f'Unsupported start tag "{tag}" at byte offset {begin}')
        argument = ""
        while self.at(i) != ord(">"):
            while self.at(i) != 0 and self.at(i) in _SPACE:
                i += 1
            if self.at(i) == ord(">"):
                break
            attribute, value, i = self.attribute(i, tag, begin)
            if tag == "a" and attribute == "href":
                argument = value
            elif tag == "code" and attribute == "class" and value.startswith("language-"):
                argument = value.removeprefix("language-")
            elif tag == "span" and attribute == "class" and value.startswith("tg-"):
                argument = value.removeprefix("tg-")
            elif tag == "tg-emoji" and attribute == "emoji-id":
                argument = value
            elif tag == "blockquote" and attribute == "expandable":
                argument = "1"
        if tag == "span" and argument != "spoiler":
            raise self.fail(f'Tag "span" must have class "tg-spoiler" at byte offset {begin}')
        self.nested.append((tag, argument, self.utf16))
        return i + 1

    def attribute(self, i: int, tag: str, begin: int) -> tuple[str, str, int]:
        """One `name=value` (or a bare `expandable`) at data[i]: (name, value, index after it)."""
        name_start = i
        while self.at(i) not in _SPACE and self.at(i) not in b"=>/":
            i += 1
        attribute = self.data[name_start:i].decode("utf-8", "replace")
        if not attribute:
            raise self.fail(f'Empty attribute name in the tag "{tag}" at byte offset {begin}')
        while self.at(i) != 0 and self.at(i) in _SPACE:
            i += 1
        if self.at(i) != ord("="):
            if tag == "blockquote" and attribute == "expandable":
                return attribute, "", i
            raise self.fail(
                f'Expected equal sign in declaration of an attribute of the tag "{tag}" at byte offset {begin}'
            )
        i += 1
        while self.at(i) != 0 and self.at(i) in _SPACE:
            i += 1
        if self.at(i) == 0:
            raise self.fail(f'Unclosed start tag "{tag}" at byte offset {begin}')
        if self.at(i) not in b"'\"":
            token_start = i
            while (self.at(i) < 128 and chr(self.at(i)).isalnum()) or self.at(i) in b".-":
                i += 1
            value = self.data[token_start:i].decode().lower()
            if self.at(i) not in _SPACE and self.at(i) != ord(">"):
                raise self.fail(f"Unexpected end of name token at byte offset {token_start}")
        else:
            end = self.data.find(bytes([self.at(i)]), i + 1)
            if end < 0:
                raise self.fail(f"Unclosed end of string literal at byte offset {i}")
            value = _decode_entities(self.data[i + 1 : end])
            i = end + 1
        if self.at(i) not in _SPACE and self.at(i) != ord(">"):
            raise self.fail(f"Expected space after end of attribute value at byte offset {i}")
        return attribute, value, i

    def end_tag(self, begin: int) -> int:
        if not self.nested:
            raise self.fail(f"Unexpected end tag at byte offset {begin}")
        i = begin + 2
        while self.at(i) not in _SPACE and self.at(i) != ord(">"):
            i += 1
        end_name = self.data[begin + 2 : i].decode("utf-8", "replace")
        while self.at(i) != 0 and self.at(i) in _SPACE:
            i += 1
        if self.at(i) != ord(">"):
            raise self.fail(f"Unclosed end tag at byte offset {begin}")
        tag, argument, offset = self.nested[-1]
        if end_name and end_name.lower() != tag:
            raise self.fail(f'Unmatched end tag at byte offset {begin}, expected "</{tag}>", found "</{end_name}>"')
        length = self.utf16 - offset
        if length:
            self.entity(tag, argument, offset, length)
        self.nested.pop()
        return i + 1

    def entity(self, tag: str, argument: str, offset: int, length: int) -> None:
        span = {"offset": offset, "length": length}
        if tag in _SIMPLE:
            self.entities.append({"type": _SIMPLE[tag], **span})
        elif tag == "a":
            url = argument or self.text_since(offset)
            if re.match(r"(https?|tg|ton)://\S+$", url) or re.match(r"[\w.-]+\.[a-z]{2,}(/\S*)?$", url):
                self.entities.append({"type": "text_link", **span, "url": url})
        elif tag == "tg-emoji":
            self.entities.append({"type": "custom_emoji", **span, "custom_emoji_id": argument})
        elif tag == "blockquote":
            self.entities.append({"type": "expandable_blockquote" if argument else "blockquote", **span})
        elif tag == "code":
            parent = self.nested[-2] if len(self.nested) >= 2 else None
            if parent is not None and parent[0] == "pre" and parent[2] == offset and argument:
                self.entities.append({"type": "pre", **span, "language": argument, "_in_pre": True})
            else:
                self.entities.append({"type": "code", **span})
        elif tag == "pre":
            last = self.entities[-1] if self.entities else None
            if last is not None and last.pop("_in_pre", False) and last["length"] == length:
                return  # <pre><code class="language-x"> is one pre entity with a language
            if last is not None and last["type"] == "code" and last["offset"] == offset and last["length"] == length:
                self.entities.pop()
            self.entities.append({"type": "pre", **span})

    def text_since(self, offset: int) -> str:
        text = self.result.decode("utf-8", "replace")
        encoded = text.encode("utf-16-le", "surrogatepass")
        return encoded[offset * 2 :].decode("utf-16-le", "replace")


def parse_html(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Parse Telegram HTML into (plain text, entities with UTF-16 offsets).

    Raises:
        ApiError: 400 "Bad Request: can't parse entities: ..." with Telegram's wording.
    """
    plain, entities = _Parser(text).parse()
    for entity in entities:
        entity.pop("_in_pre", None)
    return plain, entities


_FOUND = re.compile(
    r"(?P<bot_command>(?<![\w/])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?)(?![\w/@])"
    r"|(?P<mention>(?<![\w@])@[A-Za-z0-9_]{3,32})(?!\w)"
    r"|(?P<url>https?://[^\s<>\"]+)"
)


def _find_entities(text: str) -> list[dict[str, Any]]:
    """The entities Telegram finds in a user's plain text: bot_command, mention, url (UTF-16 offsets)."""
    found = []
    for match in _FOUND.finditer(text):
        kind = match.lastgroup or "url"
        found.append({"type": kind, "offset": utf16_len(text[: match.start()]), "length": utf16_len(match.group())})
    return found


def _parse_multipart(body: bytes, content_type: str) -> tuple[dict[str, Any], dict[str, _Upload]]:
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str):
        raise _bad("multipart body without a boundary")
    fields: dict[str, Any] = {}
    uploads: dict[str, _Upload] = {}
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        data = data.removesuffix(b"\r\n")
        part_headers = email.message.Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            key, sep, value = line.partition(":")
            if sep:
                part_headers[key.strip()] = value.strip()
        name = part_headers.get_param("name", header="content-disposition")
        filename = part_headers.get_param("filename", header="content-disposition")
        if not isinstance(name, str):
            continue
        if isinstance(filename, str):
            uploads[name] = _Upload(data, filename, part_headers.get("content-type"))
        else:
            fields[name] = data.decode("utf-8", "replace")
    return fields, uploads


# HTTP ---------------------------------------------------------------------------------------------------

_METHOD_PATH = re.compile(r"/bot(?P<token>[^/]+)/(?P<method>[A-Za-z0-9_]+)/?")
_FILE_PATH = re.compile(r"/file/bot(?P<token>[^/]+)/(?P<path>.+)")


class _Handler(BaseHTTPRequestHandler):
    """Parses one connection's requests and hands them to `fake`."""

    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects
    fake: FakeTelegram  # set on the subclass each server gets

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go out apart
        self.fake.track(self.connection, add=True)

    def finish(self) -> None:
        self.fake.track(self.connection, add=False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(chunks)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (e.g. its long-poll read timeout passed)
            self.close_connection = True

    def _handle(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        body = self._body()
        if self.command == "GET" and (found := _FILE_PATH.fullmatch(path)):
            status, data, content_type = self.fake.download(found["token"], found["path"])
            self._send(status, data, content_type)
            return
        method = _METHOD_PATH.fullmatch(path)
        if method is None:
            self._send(404, json.dumps(ApiError(404, "Not Found").document()).encode())
            return
        params: dict[str, Any] = dict(parse_qsl(url.query, keep_blank_values=True))
        uploads: dict[str, _Upload] = {}
        content_type = self.headers.get("Content-Type", "")
        try:
            if content_type.startswith("application/json") and body:
                document = json.loads(body)
                if not isinstance(document, dict):
                    raise _bad("JSON object expected")
                params.update(document)
            elif content_type.startswith("multipart/form-data"):
                fields, uploads = _parse_multipart(body, content_type)
                params.update(fields)
            elif body:
                params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        except (ValueError, ApiError) as err:
            error = err if isinstance(err, ApiError) else _bad("can't parse JSON encoded request body")
            self._send(error.status, json.dumps(error.document()).encode())
            return
        answer = self.fake.dispatch(_Request(method["token"], method["method"], params, uploads))
        if answer is None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        status, document = answer
        self._send(status, json.dumps(document).encode())


def _handler(fake: FakeTelegram) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"fake": fake})


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A running FakeTelegram on 127.0.0.1 (token "123456:TEST-TOKEN", bot @farm_test_bot)."""
    with FakeTelegram() as fake:
        yield fake
