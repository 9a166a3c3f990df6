"""memory_get: a line window of `MEMORY.md` or `memory/**/*.md`, read inside a workspace without following links."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Final

from farmhost.errors import InvalidRequest, NotAllowed
from farmhost.handling import RequestContext
from farmhost.memory.access import target_folder
from farmhost.memory.files import MAX_SERVED_BYTES, URL_ESCAPE
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.params import MemoryGetParams, parse_params
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest
from farmhost.workspace import open_workspace_file, split_relative

ONLY: Final = "memory_get reads only MEMORY.md or memory/**/*.md inside the workspace"


def _memory_path(path: str) -> str:
    """`path` when it names a memory file; anything else is not_allowed (SPEC: only those, "anything else").

    Raises:
        InvalidRequest: no path at all (empty, or control characters).
        NotAllowed: `..`, absolute, backslashes, URL escapes, or outside MEMORY.md and memory/**/*.md.
    """
    if not path or any(ord(c) < 32 for c in path):
        raise InvalidRequest("path must be non-empty text without control characters")
    if URL_ESCAPE.search(path):
        raise NotAllowed(f"path {path!r} looks URL-encoded; give the plain relative path ({ONLY})")
    try:
        parts = split_relative(path)
    except InvalidRequest as err:
        raise NotAllowed(f"{err.message} ({ONLY})") from None
    if parts != ["MEMORY.md"] and not (len(parts) >= 2 and parts[0] == "memory" and parts[-1].endswith(".md")):
        raise NotAllowed(f"{ONLY}, not {path!r}")
    return path


def _read_window(fd: int, start: int, count: int) -> dict[str, Any]:
    try:
        size = os.fstat(fd).st_size
        if size > MAX_SERVED_BYTES:
            raise NotAllowed(f"the file is {size} bytes, over the {MAX_SERVED_BYTES}-byte limit for memory files")
        with os.fdopen(os.dup(fd), "rb") as handle:
            text = handle.read(MAX_SERVED_BYTES + 1).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    lines = text.splitlines()
    window = lines[start - 1 : start - 1 + count]
    end = start - 1 + len(window)
    truncated = end < len(lines)
    return {
        "from": start,
        "lines": len(window),
        "totalLines": len(lines),
        "text": "\n".join(window),
        "truncated": truncated,
        "nextFrom": end + 1 if truncated else None,
    }


async def memory_get(ctx: RequestContext, request: AnyRequest) -> Outcome:
    """Read a window of lines from a memory file of the source group (or another, from main, or the global one)."""
    assert isinstance(request, MemoryActionRequest)
    p = parse_params(MemoryGetParams, request.params, "memory_get")
    path = _memory_path(p.path)
    start, count = p.from_, p.lines
    folder = target_folder(ctx, p.groupFolder, request.groupFolder)
    fd = open_workspace_file(ctx.layout.workspace(folder), path)
    window = await asyncio.to_thread(_read_window, fd, start, count)
    return Outcome(result={"groupFolder": folder, "path": path, **window})
