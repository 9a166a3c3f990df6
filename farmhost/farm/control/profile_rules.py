"""The farm profile's actuator rules as the watchers on effects see them: re-read only when the file changes."""

from __future__ import annotations

import logging
from pathlib import Path

from farmhost.farm.control import policy
from farmhost.farm.control.rules import ActuatorRule

logger = logging.getLogger(__name__)


class ProfileRules:
    """The rules of one profile file; a broken file keeps the last good rules (and says so once per change)."""

    def __init__(self, path: Path, *, who: str) -> None:
        self._path = path
        self._who = who
        self._stamp: tuple[int, int] | None = None
        self._rules: tuple[ActuatorRule, ...] = ()

    def current(self) -> tuple[ActuatorRule, ...]:
        """The rules now (one stat() when the file did not change)."""
        try:
            info = self._path.stat()
            stamp: tuple[int, int] | None = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return self._rules
        self._stamp = stamp
        loaded = policy.load_profile(self._path)
        if loaded.problem is not None:
            logger.error("%s: %s; the last valid rules stay in force", self._who, loaded.problem)
            return self._rules
        self._rules = loaded.rules
        return self._rules
