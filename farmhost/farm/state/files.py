"""The `farm-state/` directory on disk: atomic writes through a directory descriptor, telemetry, reading back."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from zoneinfo import ZoneInfo

from farmhost.farm.state import telemetry
from farmhost.files import write_atomic

logger = logging.getLogger(__name__)

_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StateStore:
    """The files of one `farm-state/` directory; blocking (`*_sync`): the collector calls it through a thread."""

    def __init__(self, directory: Path, *, zone: ZoneInfo, telemetry_retention_days: int) -> None:
        self.directory = directory
        self.zone = zone
        self.telemetry_retention_days = telemetry_retention_days
        self._written: dict[str, bytes] = {}

    def write_sync(
        self, files: Iterable[tuple[str, bytes]], *, rewrite: bool, sample: tuple[datetime, bytes] | None = None
    ) -> list[str]:
        """Replace each file atomically; append a telemetry line (and prune old days); return the names written.

        Args:
            files: (name, content) pairs.
            rewrite: write even what is unchanged since this store last wrote it. Background polls skip unchanged
                files (a Pi's SD card should not be rewritten every 30 s for nothing); current.json always changes.
            sample: a telemetry line and the time it was taken (which decides the day file).
        """
        written: list[str] = []
        with self._open_dir() as dir_fd:
            for name, data in files:
                if not rewrite and self._written.get(name) == data:
                    continue
                write_atomic(dir_fd, name, data)
                self._written[name] = data
                written.append(name)
            if sample is not None:
                taken, line = sample
                name = telemetry.file_name(taken, self.zone)
                telemetry.append_sample_sync(dir_fd, name, line)
                written.append(name)
                today = taken.astimezone(self.zone).date()
                telemetry.prune_sync(dir_fd, today=today, keep_days=self.telemetry_retention_days)
        return written

    def read_json_sync(self, *names: str) -> dict[str, Any]:
        """The JSON documents of an earlier run by name; a missing or unreadable file is None."""
        with self._open_dir() as dir_fd:
            return {name: _read_json(dir_fd, name) for name in names}

    @contextlib.contextmanager
    def _open_dir(self) -> Iterator[int]:
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.directory, _DIR_FLAGS)
        try:
            yield fd
        finally:
            os.close(fd)


def _read_json(dir_fd: int, name: str) -> Any:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read()
    try:
        return json.loads(data)
    except ValueError:
        logger.warning("farm state: %s is not JSON; ignoring it", name)
        return None
