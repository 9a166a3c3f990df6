"""Text that others wrote (agents, chat users, Telegram, Home Assistant), made safe for the operator's terminal.

A terminal acts on some characters instead of showing them: escape sequences (colours, cursor moves, OSC 8
links, a window title, clipboard writes), the C1 controls (0x9b is CSI on xterm), a carriage return that lets a
line overwrite itself, and the bidi overrides that show a line in another order than its bytes. Everything the
CLI and the text log print from such a source goes through `for_terminal` (a line) or `json_for_terminal`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

# C0 but tab and line break, DEL, C1, the bidi marks, embeddings, overrides and isolates, and the line separators.
_UNSAFE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_BREAKS: Final = re.compile("[\t\n]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str, *, keep_lines: bool = False) -> str:
    r"""`text` with every character a terminal would act on written out as `\x1b` / `\u202e`.

    Args:
        text: Untrusted text.
        keep_lines: Keep line breaks and tabs (a traceback); otherwise they are written out too, so one record
            stays one line and nobody can forge the next one.
    """
    shown = _UNSAFE.sub(_visible, text)
    return shown if keep_lines else _BREAKS.sub(_visible, shown)


def json_for_terminal(value: Any, **dumps: Any) -> str:
    r"""`json.dumps(value, ensure_ascii=False, **dumps)` with those characters as JSON escapes (`\u009b`).

    The JSON means the same (the exact strings come back when it is parsed); only what the terminal sees changes.
    json.dumps already escapes C0; the others can only stand inside strings, where `\uXXXX` is their spelling.
    """
    text = json.dumps(value, ensure_ascii=False, **dumps)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
