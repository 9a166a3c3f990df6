"""Logging set-up: one line per event on stderr, as text or JSON, with secrets redacted.

The JSON form (`farmhost run --log-format json`) is one object per line: `ts` (UTC, milliseconds), `level`,
`logger`, `message`, then every field the log call passed as `extra` (`group`, `requestId`, `runId`, `taskId`,
`entryId`, `chat`, ...) and `exc` for a traceback. Both forms redact bot tokens, bearer tokens, JWTs and the
configured secrets from the whole line, tracebacks included, and neither carries a character a terminal would act
on (farmhost/terminal.py): a message that holds a line break or an escape sequence shows it written out.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal

from farmhost.terminal import for_terminal, json_for_terminal

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
REDACTED: Final = "<redacted>"
TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

# Libraries that log every HTTP call at INFO (python-telegram-bot's long poll: one line every 30 s); their lines
# show with --verbose only.
CHATTY_LOGGERS: Final = ("httpx",)

_SECRET = re.compile(r"(bot\d+:[A-Za-z0-9_-]{20,}|Bearer\s+[A-Za-z0-9._-]{10,}|eyJ[A-Za-z0-9._-]{20,})")
# Attributes every LogRecord has; anything else on a record came from the call's `extra`.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class Redactor:
    """Replaces secrets in a formatted line: known token shapes, and the configured values themselves."""

    def __init__(self, secrets: Sequence[str]) -> None:
        values = [s for s in secrets if s and len(s) >= 6]
        # A secret inside a JSON line may appear escaped; redact that spelling too.
        self._secrets = sorted({*values, *(json.dumps(s)[1:-1] for s in values)}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        """`text` with every secret replaced by `<redacted>`."""
        cleaned = _SECRET.sub(REDACTED, text)
        for secret in self._secrets:
            cleaned = cleaned.replace(secret, REDACTED)
        return cleaned


class TextFormatter(logging.Formatter):
    """`2026-01-05 07:00:01,234 INFO    farmhost.app: message` (a traceback follows on its own lines)."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__(TEXT_FORMAT)
        self._redact = redact

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line without its traceback: whatever the message holds, one line a terminal only shows."""
        return for_terminal(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        """The redacted line (and the traceback's lines, with no escape sequence on them either)."""
        return self._redact(for_terminal(super().format(record), keep_lines=True))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        """The redacted JSON line."""
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        doc: dict[str, Any] = {
            "ts": stamp,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return self._redact(json_for_terminal(doc, default=str, separators=(",", ":")))


def configure(level: str, *, secrets: Sequence[str], log_format: LogFormat = "text") -> None:
    """Send every log record to stderr at `level`, one line per event in `log_format`."""
    redact = Redactor(secrets)
    # No line shows the process, thread or multiprocessing names: skip looking them up for every record (a
    # `getpid` system call each time, on every request's line).
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(redact) if log_format == "json" else TextFormatter(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)
