"""Routing of one inbound Telegram message: run the agent, keep it as context, answer a command, offer, or ignore.

Pure: it gets the registered group (or None) and what the message says, and decides. The rules (docs/telegram.md):

- The bot's own messages are ignored; other bots' messages are kept as context in a registered chat but never
  trigger anything (two bots must not talk each other into a loop).
- The main chat never needs a trigger; with `FARMHOST_TELEGRAM_MAIN_SENDERS` set, only those user ids are heard
  there (anyone else is ignored, not even stored).
- Any other registered chat needs its trigger unless `requiresTrigger` is off: the group's trigger (e.g. `@Farm`)
  as a whole word anywhere in the text or caption, any case; `@<botusername>` anywhere, or a reply to one of the
  bot's messages, always count. Messages without one are stored and given to the next run as context.
- `/help` (also `/start`) works in every registered chat, `/status`, `/tasks`, `/stop` and `/resume` are
  main-only (commands.py answers the refusal); `/cmd@<botusername>` is the same command, `/cmd@otherbot` is plain text.
- An unregistered chat is offered to the main chat when it addresses the bot (a private chat, a mention, a reply
  to the bot, a command for the bot); anything else there is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal

from farmhost.store.groups import Group

RouteAction = Literal["run", "store", "ignore", "offer", "command"]

COMMANDS: Final = frozenset({"help", "start", "status", "tasks", "stop", "resume"})
MAIN_ONLY_COMMANDS: Final = frozenset({"status", "tasks", "stop", "resume"})
# `/name` or `/name@botname` at the very start; Telegram allows letters, digits and '_' (at most 32).
_COMMAND_RE: Final = re.compile(r"^/([A-Za-z0-9_]{1,32})(?:@([A-Za-z0-9_]{1,64}))?(?=\s|$)(.*)$", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class Incoming:
    """What routing needs to know about a message."""

    text: str
    chat_type: str = "group"
    sender_id: int | None = None
    sender_is_bot: bool = False
    reply_to_bot: bool = False


@dataclass(frozen=True)
class Route:
    """The decision: what to do, why, and for a command which one and its arguments."""

    action: RouteAction
    reason: str
    command: str | None = None
    args: str = ""


def parse_senders(raw: str | None) -> frozenset[int]:
    """The main-chat sender allowlist from `FARMHOST_TELEGRAM_MAIN_SENDERS` (comma/space separated user ids).

    Raises:
        ValueError: an entry is not an integer.
    """
    if not raw:
        return frozenset()
    ids = set()
    for part in re.split(r"[,\s]+", raw.strip()):
        if part:
            try:
                ids.add(int(part))
            except ValueError:
                raise ValueError(f"FARMHOST_TELEGRAM_MAIN_SENDERS: {part!r} is not a Telegram user id") from None
    return frozenset(ids)


def parse_command(text: str, bot_username: str) -> tuple[str, str] | None:
    """`(name, args)` of a command for this bot (`/help`, `/help@thisbot`), lower-cased; None otherwise."""
    match = _COMMAND_RE.match(text)
    if match is None:
        return None
    name, target, rest = match.groups()
    if target is not None and target.lower() != bot_username.lower():
        return None
    return name.lower(), rest.strip()


def mentions_bot(text: str, bot_username: str) -> bool:
    """Whether `@<bot_username>` appears as a whole word, any case."""
    return bool(bot_username) and _word_re(f"@{bot_username}").search(text) is not None


def has_trigger(text: str, trigger: str | None) -> bool:
    """Whether the group's trigger appears in `text` as a whole word (not inside another word), any case."""
    word = (trigger or "").strip()
    return bool(word) and _word_re(word).search(text) is not None


@lru_cache(maxsize=256)
def _word_re(word: str) -> re.Pattern[str]:
    # A word character (or '@', for '@name' triggers) right before or after means it is part of something else.
    starts_word = word[0].isalnum() or word[0] == "_"
    before = r"(?<![\w@])" if word[0] == "@" else (r"(?<!\w)" if starts_word else "")
    after = r"(?!\w)" if word[-1].isalnum() or word[-1] == "_" else ""
    return re.compile(before + re.escape(word) + after, re.IGNORECASE)


def addresses_bot(message: Incoming, bot_username: str) -> bool:
    """Whether a message is meant for the bot: a private chat, a mention, a reply to it, or a command for it."""
    return (
        message.chat_type == "private"
        or message.reply_to_bot
        or mentions_bot(message.text, bot_username)
        or parse_command(message.text, bot_username) is not None
    )


def route(
    group: Group | None,
    message: Incoming,
    *,
    bot_username: str,
    bot_id: int | None,
    main_senders: frozenset[int],
) -> Route:
    """Decide what to do with one message of the chat `group` is registered for (None: an unregistered chat)."""
    if bot_id is not None and message.sender_id == bot_id:
        return Route("ignore", "the bot's own message")
    if group is None:
        if message.sender_is_bot:
            return Route("ignore", "a bot's message in an unregistered chat")
        if addresses_bot(message, bot_username):
            return Route("offer", "an unregistered chat addresses the bot")
        return Route("ignore", "the chat is not registered")
    if message.sender_is_bot:
        return Route("store", "another bot's message: context only")
    if group.is_main and main_senders and message.sender_id not in main_senders:
        return Route("ignore", f"sender {message.sender_id} is not in FARMHOST_TELEGRAM_MAIN_SENDERS")
    command = parse_command(message.text, bot_username)
    if command is not None and command[0] in COMMANDS:
        return Route("command", f"the /{command[0]} command", command=command[0], args=command[1])
    if group.is_main:
        return Route("run", "the main chat needs no trigger")
    if not group.requires_trigger:
        return Route("run", "the group needs no trigger")
    if has_trigger(message.text, group.trigger):
        return Route("run", f"the trigger {group.trigger}")
    if mentions_bot(message.text, bot_username):
        return Route("run", f"a mention of @{bot_username}")
    if message.reply_to_bot:
        return Route("run", "a reply to the bot")
    return Route("store", "no trigger: context for the next run")
