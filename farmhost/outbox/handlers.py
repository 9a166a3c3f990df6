"""IPC handlers of the messages/ queue: authorise, chunk, and put text or files into the durable outbox."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from dataclasses import dataclass
from functools import partial
from io import FileIO
from pathlib import Path, PurePosixPath
from typing import Final

from farmhost.config import OutboxSettings
from farmhost.errors import InvalidRequest, NotAllowed, RateLimited, Unauthorized
from farmhost.handling import Change, Effect, Handlers, HandlerSpec, RequestContext
from farmhost.outbox.chunking import split_text
from farmhost.pacing import BytePacer
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, FileRequest, MessageRequest
from farmhost.store import groups, outbox
from farmhost.store.groups import Group
from farmhost.workspace import open_workspace_file

# Telegram bots may upload documents up to 50 MB; a larger file could never be delivered.
MAX_FILE_BYTES: Final = 50 * 1024 * 1024
_COPY_CHUNK: Final = 1024 * 1024
# One budget for every group's copies (farmhost/pacing.py).
_COPIES: Final = BytePacer()
_SUFFIX_RE: Final = re.compile(r"\.[a-z0-9]{1,10}")


def authorised_target(conn: sqlite3.Connection, source: Group, chat_jid: str) -> Group:
    """The registered group of `chat_jid`, if the source group may write to it.

    Raises:
        Unauthorized: the chat is not registered, or belongs to another group and the source is not main.
    """
    target = groups.find_by_jid(conn, chat_jid)
    if target is None:
        raise Unauthorized(f"chat {chat_jid} is not registered; messages go only to registered chats")
    if not source.is_main and target.folder != source.folder:
        raise Unauthorized(f"group {source.folder!r} may only send to its own chat, not to {chat_jid}")
    return target


def within_share(conn: sqlite3.Connection, folder: str, adding: int, limit: int) -> None:
    """Refuse what would take a group past its share of undelivered outbox entries.

    Raises:
        RateLimited: the group's undelivered chunks and files, with these, would be more than `limit`.
    """
    waiting = outbox.count_pending_from(conn, folder)
    if waiting + adding > limit:
        raise RateLimited(
            f"{waiting} message chunks or files of this group wait for delivery and this would add {adding} (the "
            f"limit is {limit}); Telegram sends about 20 messages a minute in a group: send it once those are out"
        )


def apply_message(
    settings: OutboxSettings, ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection
) -> Outcome:
    """Queue a text message as Telegram-sized chunks."""
    assert isinstance(request, MessageRequest)
    authorised_target(conn, ctx.group, request.chatJid)
    chunks = split_text(request.text)
    if not chunks:
        raise InvalidRequest("text is empty (only whitespace); nothing to send")
    within_share(conn, ctx.group.folder, len(chunks), settings.group_max_chunks)
    outbox.enqueue(
        conn,
        message_key=f"ipc:{ctx.group.folder}:{ctx.request_id}",
        chat_jid=request.chatJid,
        source_folder=ctx.group.folder,
        chunks=chunks,
        at=ctx.now,
    )
    ctx.changes.add(Change.OUTBOX)
    return Outcome(result={"queued": True, "chatJid": request.chatJid, "chunks": len(chunks)})


@dataclass(frozen=True, kw_only=True)
class _FileCopy:
    """The host's private copy of a workspace file, made before the outbox transaction."""

    path: Path
    size: int


async def prepare_file(settings: OutboxSettings, ctx: RequestContext, request: AnyRequest) -> _FileCopy:
    """Authorise, then copy the workspace file into the host's outbox store in a thread (it may be 50 MB)."""
    assert isinstance(request, FileRequest)
    authorised_target(ctx.db.conn, ctx.group, request.chatJid)
    within_share(ctx.db.conn, ctx.group.folder, 1, settings.group_max_chunks)  # before copying anything
    workspace = ctx.layout.workspace(ctx.group.folder)
    target = ctx.layout.outbox_files / ctx.group.folder / f"{ctx.request_id}{_suffix(request.path)}"
    limit, rate = settings.group_max_bytes, settings.file_copy_bytes_per_second
    return await asyncio.to_thread(_copy_sync, workspace, request.path, target, limit, rate)


def apply_file(settings: OutboxSettings, ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Queue the copy `prepare_file` made."""
    assert isinstance(request, FileRequest) and isinstance(ctx.prepared, _FileCopy)
    try:
        authorised_target(conn, ctx.group, request.chatJid)  # again inside the transaction: the registry may change
        within_share(conn, ctx.group.folder, 1, settings.group_max_chunks)
    except Exception:
        ctx.prepared.path.unlink(missing_ok=True)  # a copy nothing will send would hold the group's byte budget
        raise
    outbox.enqueue(
        conn,
        message_key=f"ipc:{ctx.group.folder}:{ctx.request_id}",
        chat_jid=request.chatJid,
        source_folder=ctx.group.folder,
        chunks=[request.caption or ""],
        at=ctx.now,
        kind="file",
        file_path=str(ctx.prepared.path),
        options={"file_name": request.path.rsplit("/", 1)[-1]},
    )
    ctx.changes.add(Change.OUTBOX)
    return Outcome(result={"queued": True, "chatJid": request.chatJid, "bytes": ctx.prepared.size})


def _suffix(path: str) -> str:
    """The file's extension when it is a plain one (it decides photo or document); the name itself is the host's."""
    suffix = PurePosixPath(path).suffix.lower()
    return suffix if _SUFFIX_RE.fullmatch(suffix) else ""


def _unsent_bytes(folder: Path) -> int:
    """Bytes of the copies in one group's outbox folder that are not delivered yet (a sent copy is deleted)."""
    try:
        with os.scandir(folder) as entries:
            return sum(entry.stat(follow_symlinks=False).st_size for entry in entries if entry.is_file())
    except FileNotFoundError:
        return 0


def _copy_paced(source_fd: int, dst: FileIO, size: int, bytes_per_second: float) -> int:
    """Copy at most `size` bytes, the size checked against the caps: the agent may append while this runs.

    Returns the bytes copied, fewer than `size` when the agent truncated its file meanwhile.
    """
    copied = 0
    while copied < size and (chunk := os.read(source_fd, min(_COPY_CHUNK, size - copied))):
        _COPIES.take(len(chunk), bytes_per_second)
        dst.write(chunk)
        copied += len(chunk)
    return copied


def _copy_sync(workspace: Path, path: str, target: Path, limit: int, rate: float) -> _FileCopy:
    source_fd = open_workspace_file(workspace, path)
    try:
        size = os.fstat(source_fd).st_size
        if size > MAX_FILE_BYTES:
            raise NotAllowed(f"{path!r} is {size} bytes; Telegram accepts files up to {MAX_FILE_BYTES} bytes")
        if size == 0:
            raise InvalidRequest(f"{path!r} is empty; nothing to send")
        unsent = _unsent_bytes(target.parent)
        if unsent + size > limit:
            raise RateLimited(
                f"this group's unsent files already take {unsent // 2**20} MiB of the outbox (the limit is "
                f"{limit // 2**20} MiB); send this file once those are delivered"
            )
        # A private copy: the agent may change or delete its file before delivery.
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(target, "wb", buffering=0) as dst:
                copied = _copy_paced(source_fd, dst, size, rate)
                os.fsync(dst.fileno())
            if copied == 0:
                raise InvalidRequest(f"{path!r} was emptied while it was copied; nothing to send")
        except BaseException:
            target.unlink(missing_ok=True)  # a partial copy would hold the group's outbox budget
            raise
    finally:
        os.close(source_fd)
    # What was copied, not what was measured: the result and the budget count the bytes Telegram will get.
    return _FileCopy(path=target, size=copied)


def outbox_handlers(settings: OutboxSettings) -> Handlers:
    """The messages/ handlers; `settings` bound what a group may have undelivered and how fast copies are made."""
    return {
        "message": HandlerSpec(effect=Effect.STATE, apply=partial(apply_message, settings)),
        "file": HandlerSpec(
            effect=Effect.STATE, prepare=partial(prepare_file, settings), apply=partial(apply_file, settings)
        ),
    }
