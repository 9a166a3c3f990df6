"""IPC handlers of the messages/ queue: authorise, chunk, and put text or files into the durable outbox."""

from __future__ import annotations

import os
import shutil
import sqlite3
from typing import Final

from farmhost.errors import InvalidRequest, NotAllowed, Unauthorized
from farmhost.ipc.handlers import Change, Effect, Handlers, HandlerSpec, RequestContext
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, FileRequest, MessageRequest
from farmhost.store import groups, outbox
from farmhost.store.groups import Group
from farmhost.telegram.chunking import split_text
from farmhost.workspace import open_workspace_file

# Telegram bots may upload documents up to 50 MB; a larger file could never be delivered.
MAX_FILE_BYTES: Final = 50 * 1024 * 1024


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


def apply_message(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Queue a text message as Telegram-sized chunks."""
    assert isinstance(request, MessageRequest)
    authorised_target(conn, ctx.group, request.chatJid)
    chunks = split_text(request.text)
    if not chunks:
        raise InvalidRequest("text is empty (only whitespace); nothing to send")
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


def apply_file(ctx: RequestContext, request: AnyRequest, conn: sqlite3.Connection) -> Outcome:
    """Copy a workspace file into the host's outbox store and queue it."""
    assert isinstance(request, FileRequest)
    authorised_target(conn, ctx.group, request.chatJid)
    source_fd = open_workspace_file(ctx.layout.workspace(ctx.group.folder), request.path)
    try:
        size = os.fstat(source_fd).st_size
        if size > MAX_FILE_BYTES:
            raise NotAllowed(f"{request.path!r} is {size} bytes; Telegram accepts files up to {MAX_FILE_BYTES} bytes")
        if size == 0:
            raise InvalidRequest(f"{request.path!r} is empty; nothing to send")
        # A private copy: the agent may change or delete its file before delivery.
        target_dir = ctx.layout.outbox_files / ctx.group.folder
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"{ctx.request_id}-{request.path.rsplit('/', 1)[-1]}"
        with os.fdopen(os.dup(source_fd), "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
            dst.flush()
            os.fsync(dst.fileno())
    finally:
        os.close(source_fd)
    outbox.enqueue(
        conn,
        message_key=f"ipc:{ctx.group.folder}:{ctx.request_id}",
        chat_jid=request.chatJid,
        source_folder=ctx.group.folder,
        chunks=[request.caption or ""],
        at=ctx.now,
        kind="file",
        file_path=str(target),
        options={"file_name": request.path.rsplit("/", 1)[-1]},
    )
    ctx.changes.add(Change.OUTBOX)
    return Outcome(result={"queued": True, "chatJid": request.chatJid, "bytes": size})


HANDLERS: Final[Handlers] = {
    "message": HandlerSpec(effect=Effect.STATE, apply=apply_message),
    "file": HandlerSpec(effect=Effect.STATE, apply=apply_file),
}
