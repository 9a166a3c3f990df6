"""Inbound media: a placeholder line for every kind, and the file itself saved into the group's `inbox/`.

The transcript and the agent's prompt get text such as `[photo: inbox/2026-11-30T10-00-00-photo-123.jpg] caption`
or `[voice: (not saved: 25 MB is over the 20 MB limit)]`. Files go to `<workspace>/inbox/` under a name made of the
message's local time, the kind and the message id (so a redelivered update rewrites the same file), written
through descriptors that never follow a link the agent may have planted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mimetypes
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

from telegram import Bot, Message
from telegram.error import NetworkError, RetryAfter, TelegramError

from farmhost.files import DIR_FLAGS, write_atomic
from farmhost.outbox.text import one_line

logger = logging.getLogger(__name__)

INBOX: Final = "inbox"
_SAFE_NAME_RE: Final = re.compile(r"[^A-Za-z0-9._-]+")
_NAME_CHARS: Final = 80
_SUFFIXES: Final = {"photo": ".jpg", "voice": ".ogg", "video_note": ".mp4", "video": ".mp4", "audio": ".mp3"}


class MediaRetry(Exception):
    """A download failed in a way that may pass (network, flood control): process the update again later."""


@dataclass(frozen=True, kw_only=True)
class MediaRef:
    """The media of a message: a file to fetch (`file_id`) or a description only (`detail`)."""

    kind: str
    file_id: str | None = None
    file_size: int | None = None
    file_name: str | None = None
    mime_type: str | None = None
    detail: str | None = None
    too_big: int | None = None  # every version of the file is over the cap (the largest one's size)


def media_of(message: Message, *, max_bytes: int) -> MediaRef | None:
    """What media a message carries, if any (for a photo: the largest size within `max_bytes`)."""
    if message.photo:
        sizes = sorted(message.photo, key=lambda p: (p.file_size or 0, p.width * p.height))
        fitting = [p for p in sizes if p.file_size is None or p.file_size <= max_bytes]
        if not fitting:
            return MediaRef(kind="photo", too_big=sizes[-1].file_size)
        best = fitting[-1]
        return MediaRef(kind="photo", file_id=best.file_id, file_size=best.file_size)
    if message.location is not None:
        where = f"{round(message.location.latitude, 6)}, {round(message.location.longitude, 6)}"
        if message.venue is not None:
            where += f" ({one_line(message.venue.title)})"
        return MediaRef(kind="location", detail=where)
    if message.contact is not None:
        contact = message.contact
        name = one_line(" ".join(filter(None, (contact.first_name, contact.last_name))))
        return MediaRef(kind="contact", detail=f"{name}, {one_line(contact.phone_number)}")
    if message.sticker is not None:
        return MediaRef(kind="sticker", detail=message.sticker.emoji or "no emoji")
    if message.poll is not None:
        return MediaRef(kind="poll", detail=one_line(message.poll.question))
    for kind in ("voice", "audio", "video", "video_note", "document"):
        item = getattr(message, kind)
        if item is not None:
            return MediaRef(
                kind=kind,
                file_id=item.file_id,
                file_size=item.file_size,
                file_name=getattr(item, "file_name", None),
                mime_type=getattr(item, "mime_type", None),
            )
    return None


def placeholder(ref: MediaRef, detail: str) -> str:
    """The text standing for the media in the transcript and the prompt."""
    return f"[{ref.kind}: {detail}]"


def describe_unsaved(ref: MediaRef) -> str:
    """The placeholder of media that is not downloaded (an unregistered chat, an edit)."""
    return placeholder(ref, ref.detail or "not saved")


def size_text(size: int) -> str:
    """A byte count as people read it: `25 MB`, `2.5 MB`, `900 KB`, `12 bytes`."""
    mib, kib = 1024 * 1024, 1024
    if size >= mib:
        value = size / mib
        return f"{value:.0f} MB" if value >= 10 or value.is_integer() else f"{value:.1f} MB"
    if size >= kib:
        return f"{size // kib} KB"
    return f"{size} bytes"


def over_limit(size: int, max_bytes: int) -> str:
    """The reason a file was not saved because of the cap."""
    return f"(not saved: {size_text(size)} is over the {size_text(max_bytes)} limit)"


def inbox_name(ref: MediaRef, *, message_id: int, local_time: datetime) -> str:
    """The file's name in `inbox/`: local time, kind, message id, and the sender's own name for a document."""
    stem = f"{local_time:%Y-%m-%dT%H-%M-%S}-{ref.kind.replace('_', '-')}-{message_id}"
    if ref.file_name:
        safe = _SAFE_NAME_RE.sub("_", ref.file_name).lstrip("._-")[-_NAME_CHARS:]
        if safe:
            return f"{stem}-{safe}"
    suffix = _SUFFIXES.get(ref.kind) or (mimetypes.guess_extension(ref.mime_type or "") or ".bin")
    return stem + suffix


@dataclass(frozen=True)
class Saved:
    """Media after `save_media`: its placeholder, and its bytes when it was saved into the inbox."""

    placeholder: str
    data: bytes | None = None


async def save_media(
    bot: Bot, ref: MediaRef, workspace: Path, *, message_id: int, local_time: datetime, max_bytes: int
) -> Saved:
    """Fetch the media's file into the workspace's inbox; its placeholder says where, or why it is not saved.

    Raises:
        MediaRetry: a network error or flood control; the caller processes the update again later.
    """
    if ref.file_id is None:
        if ref.too_big is not None:
            return Saved(placeholder(ref, over_limit(ref.too_big, max_bytes)))
        return Saved(describe_unsaved(ref))
    if ref.file_size is not None and ref.file_size > max_bytes:
        return Saved(placeholder(ref, over_limit(ref.file_size, max_bytes)))
    try:
        file = await bot.get_file(ref.file_id)
        if file.file_size is not None and file.file_size > max_bytes:
            return Saved(placeholder(ref, over_limit(file.file_size, max_bytes)))
        data = bytes(await file.download_as_bytearray())
    except (NetworkError, RetryAfter) as err:
        raise MediaRetry(f"downloading the {ref.kind} failed: {err}") from err
    except (TelegramError, RuntimeError) as err:
        logger.warning("telegram: cannot download a %s (message %d): %s", ref.kind, message_id, err)
        return Saved(placeholder(ref, f"(not saved: Telegram would not give the file: {one_line(str(err))})"))
    if len(data) > max_bytes:
        return Saved(placeholder(ref, over_limit(len(data), max_bytes)))
    name = inbox_name(ref, message_id=message_id, local_time=local_time)
    try:
        await asyncio.to_thread(write_inbox_file, workspace, name, data)
    except OSError as err:
        logger.error("telegram: cannot save a %s into %s/%s: %s", ref.kind, workspace, INBOX, err)
        return Saved(placeholder(ref, f"(not saved: cannot write to {INBOX}/: {err.strerror or err})"))
    return Saved(placeholder(ref, f"{INBOX}/{name}"), data)


def write_inbox_file(workspace: Path, name: str, data: bytes) -> None:
    """Write `inbox/<name>` in `workspace` atomically, creating `inbox/`; no path component may be a link.

    Raises:
        OSError: the workspace or `inbox` is missing or a link, or the write failed.
    """
    ws = os.open(workspace, DIR_FLAGS)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(INBOX, 0o755, dir_fd=ws)
        inbox = os.open(INBOX, DIR_FLAGS, dir_fd=ws)
    finally:
        os.close(ws)
    try:
        write_atomic(inbox, name, data)
    finally:
        os.close(inbox)
