"""The group's running conversation (`contextMode: group`): `.farmagent/conversation.json` in the workspace.

Bounded to the last MAX_MESSAGES messages and MAX_CHARS characters, always starting at a user message so a
tool result never loses the call it answers, and written atomically (temp file, fsync, rename). A file that
is missing, a link, too big or not the expected shape starts a fresh conversation with a note on stderr;
it never fails a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any, Final

STATE_DIR: Final = ".farmagent"
CONVERSATION_FILE: Final = "conversation.json"
# About twenty exchanges: enough to carry "the pump I mentioned" across runs, small enough for a small model.
MAX_MESSAGES: Final = 40
MAX_CHARS: Final = 60_000
MAX_FILE_BYTES: Final = 2 << 20
_ROLES: Final = frozenset({"user", "assistant", "tool"})
_KEYS: Final = ("role", "content", "tool_calls", "tool_call_id")


def conversation_path(group_dir: Path) -> Path:
    """Where a group's conversation is kept."""
    return group_dir / STATE_DIR / CONVERSATION_FILE


def load(group_dir: Path) -> list[dict[str, Any]]:
    """The stored messages (oldest first), or [] when there are none or they cannot be used."""
    path = conversation_path(group_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as err:
        _note(f"cannot open {path} ({err.strerror}); starting a fresh conversation")
        return []
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            _note(f"{path} is not a regular file under {MAX_FILE_BYTES} bytes; starting a fresh conversation")
            return []
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        document = json.loads(data)
        messages = document["messages"]
        assert isinstance(messages, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        _note(f"{path} is not a conversation file; starting a fresh conversation")
        return []
    return bound([m for m in (_clean(item) for item in messages) if m is not None])


def save(group_dir: Path, messages: list[dict[str, Any]]) -> None:
    """Store the bounded conversation atomically (errors are noted on stderr, never raised)."""
    state = group_dir / STATE_DIR
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(state, 0o700)
        if not stat.S_ISDIR(os.lstat(state).st_mode):
            raise NotADirectoryError(0, f"{state} is not a directory")
        data = json.dumps({"version": 1, "messages": bound(messages)}, ensure_ascii=False).encode("utf-8")
        tmp = state / f".{CONVERSATION_FILE}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(tmp, state / CONVERSATION_FILE)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as err:
        _note(f"cannot save the conversation in {state} ({err.strerror or err}); the next run starts fresh")


def bound(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest messages within MAX_MESSAGES and MAX_CHARS, starting at a user message."""
    kept: list[dict[str, Any]] = []
    used = 0
    for message in reversed(messages):
        size = len(json.dumps(message, ensure_ascii=False))
        if len(kept) >= MAX_MESSAGES or used + size > MAX_CHARS:
            break
        kept.append(message)
        used += size
    kept.reverse()
    while kept and kept[0]["role"] != "user":
        kept.pop(0)
    return kept


def _clean(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or item.get("role") not in _ROLES:
        return None
    return {key: item[key] for key in _KEYS if key in item}


def _note(text: str) -> None:
    print(f"farmagent: {text}", file=sys.stderr)
