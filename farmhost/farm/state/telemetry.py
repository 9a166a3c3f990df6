"""Telemetry: the daily `telemetry-YYYY-MM-DD.ndjson` files of numeric sensor samples, and their retention."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime, timedelta, tzinfo
from typing import Any, Final

from farmhost.farm.state.alerts import local_iso
from farmhost.files import write_atomic

TELEMETRY_RE: Final = re.compile(r"^telemetry-(\d{4}-\d{2}-\d{2})\.ndjson$")
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def numeric_values(states: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The sensors worth sampling: `sensor.*` with a finite numeric state and a unit or a state class.

    A unit or `state_class` is what tells a measurement (moisture, temperature, flow) apart from a number that is
    an identifier or a count of something else; timestamps and text sensors never parse as numbers.
    """
    values: dict[str, float] = {}
    for state in states:
        entity_id = state.get("entity_id")
        if not isinstance(entity_id, str) or not entity_id.startswith("sensor."):
            continue
        attrs = state.get("attributes")
        if not isinstance(attrs, Mapping) or not (attrs.get("unit_of_measurement") or attrs.get("state_class")):
            continue
        raw = state.get("state")
        if not isinstance(raw, str):
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value):
            values[entity_id] = value
    return dict(sorted(values.items()))


def file_name(moment: datetime, zone: tzinfo) -> str:
    """The day file a sample taken at `moment` belongs to (the date in the farm's time zone)."""
    return f"telemetry-{moment.astimezone(zone).date().isoformat()}.ndjson"


def sample_line(moment: datetime, values: Mapping[str, float], zone: tzinfo) -> bytes:
    """One NDJSON line: `{"ts": <farm-local ISO>, "values": {entity_id: number}}`."""
    doc = {"ts": local_iso(moment, zone), "values": dict(values)}
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def append_sample_sync(dir_fd: int, name: str, line: bytes) -> None:
    """Append one line by rewriting the day file atomically: a reader never sees half a line.

    A day at the default 5-minute cadence is 288 lines, so rewriting stays cheap; an append in place could leave a
    torn last line after a power cut, which every reader would then have to tolerate.
    """
    existing = _read_sync(dir_fd, name)
    if existing and not existing.endswith(b"\n"):
        existing += b"\n"
    write_atomic(dir_fd, name, existing + line)


def prune_sync(dir_fd: int, *, today: date, keep_days: int) -> list[str]:
    """Delete day files older than `keep_days` days before `today`; returns the names deleted."""
    cutoff = today - timedelta(days=keep_days)
    deleted: list[str] = []
    for name in sorted(os.listdir(dir_fd)):
        match = TELEMETRY_RE.fullmatch(name)
        if match is None:
            continue
        try:
            day = date.fromisoformat(match.group(1))
        except ValueError:
            continue
        if day < cutoff:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
            deleted.append(name)
    return deleted


def _read_sync(dir_fd: int, name: str) -> bytes:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        return handle.read()
