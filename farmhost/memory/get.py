"""memory_get: a line window of `MEMORY.md` or `memory/**/*.md`, read inside a workspace without following links."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Final

from farmhost.errors import InvalidRequest, NotAllowed
from farmhost.ipc.handlers import RequestContext
from farmhost.memory.access import target_folder
from farmhost.protocol.envelope import Outcome
from farmhost.protocol.requests import AnyRequest, MemoryActionRequest
from farmhost.workspace import open_workspace_file, split_relative

DEFAULT_LINES: Final = 200
MAX_LINES: Final = 2000
# A memory file is notes, not a data dump; anything bigger is read in windows by line, never whole.
MAX_FILE_BYTES: Final = 4 * 1024 * 1024
_PARAMS: Final = frozenset({"path", "groupFolder", "from", "lines"})


def _memory_path(path: Any) -> str:
    if not isinstance(path, str):
        raise InvalidRequest("path must be text, e.g. MEMORY.md or memory/fields.md")
    if "%" in path:
        raise InvalidRequest(f"path {path!r} looks URL-encoded; give the plain relative path")
    parts = split_relative(path)
    if parts != ["MEMORY.md"] and not (len(parts) >= 2 and parts[0] == "memory" and parts[-1].endswith(".md")):
        raise NotAllowed(f"memory_get reads only MEMORY.md or memory/**/*.md, not {path!r}")
    return path


def _int_param(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _read_window(fd: int, start: int, count: int) -> dict[str, Any]:
    try:
        size = os.fstat(fd).st_size
        if size > MAX_FILE_BYTES:
            raise NotAllowed(f"the file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit for memory files")
        with os.fdopen(os.dup(fd), "rb") as handle:
            text = handle.read(MAX_FILE_BYTES + 1).decode("utf-8", errors="replace")
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
    params = request.params
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise InvalidRequest(f"unknown param(s) {', '.join(unknown)}; memory_get takes path, groupFolder, from, lines")
    path = _memory_path(params.get("path"))
    start = _int_param(params, "from", 1, 1, 10_000_000)
    count = _int_param(params, "lines", DEFAULT_LINES, 1, MAX_LINES)
    folder = target_folder(ctx, params, request.groupFolder)
    fd = open_workspace_file(ctx.layout.workspace(folder), path)
    window = await asyncio.to_thread(_read_window, fd, start, count)
    return Outcome(result={"groupFolder": folder, "path": path, **window})
