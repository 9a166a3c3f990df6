"""Logging set-up: one line per event on stderr, with secrets redacted."""

from __future__ import annotations

import logging
import re

_SECRET = re.compile(r"(bot\d+:[A-Za-z0-9_-]{20,}|Bearer\s+[A-Za-z0-9._-]{10,}|eyJ[A-Za-z0-9._-]{20,})")


class RedactSecrets(logging.Filter):
    """Replace bot tokens, bearer tokens and JWTs in log records with `<redacted>`."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s and len(s) >= 6]

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the message in place; never drops a record."""
        message = record.getMessage()
        cleaned = _SECRET.sub("<redacted>", message)
        for secret in self._secrets:
            cleaned = cleaned.replace(secret, "<redacted>")
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def configure(level: str, *, secrets: list[str]) -> None:
    """Send farmhost's logs to stderr at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
