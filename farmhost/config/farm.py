"""The farm's sections: Home Assistant, the farm actions' settings, the state collector's and the alerts' told."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

FarmMode = Literal["demo", "production"]


@dataclass(frozen=True, kw_only=True)
class HaSettings:
    """Home Assistant: HA_URL and HA_TOKEN (both set, or Home Assistant is off)."""

    url: str | None
    token: str | None = field(repr=False)

    @property
    def enabled(self) -> bool:
        """Home Assistant is configured."""
        return bool(self.url and self.token)


@dataclass(frozen=True, kw_only=True)
class AlertThresholds:
    """The operator's thresholds for the alert rules (FARMHOST_ALERT_*)."""

    # 2 °C: air at 2 m reads a few degrees warmer than the crop on a clear night, so ground frost starts above 0 °C.
    frost_celsius: float = 2.0
    # 25 %: volumetric water content where most field crops in loam start to suffer; tune per soil and probe.
    soil_low_percent: float = 25.0
    # 10 min: long enough to ride out an HA restart or a Zigbee hiccup, short enough to notice a dead probe the same hour.
    unavailable_minutes: float = 10.0
    ignored_entities: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, kw_only=True)
class StateSettings:
    """The farm state collector's: cadences, retention, calendar horizon and alert thresholds."""

    zone: ZoneInfo
    farm_mode: FarmMode
    poll_seconds: float
    telemetry_seconds: float
    inventory_seconds: float
    telemetry_retention_days: int
    calendar_days: int
    resolved_keep: int
    thresholds: AlertThresholds


@dataclass(frozen=True, kw_only=True)
class FarmSettings:
    """What the farm actions read: the profile, the mode, the zone, HA's login (screenshots) and the collector's."""

    profile_path: Path  # FARM_PROFILE_PATH, else <data>/farm-profile.json
    mode: FarmMode
    zone: ZoneInfo
    audit_max_bytes: int  # farm-state/audit.ndjson rotates past this (FARMHOST_REQUEST_LOG_BYTES)
    max_pending_approvals: int
    dashboard_backups: int
    ha: HaSettings
    state: StateSettings


@dataclass(frozen=True, kw_only=True)
class QuietHours:
    """`HH-HH` in the farm's time zone: warnings due inside wait for the end; start == end is never quiet."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> QuietHours:
        """Read `22-06`.

        Raises:
            ValueError: not two hours 0-23 joined by `-`.
        """
        match = re.fullmatch(r"\s*([0-9]{1,2})\s*-\s*([0-9]{1,2})\s*", text)
        if match is None or int(match[1]) > 23 or int(match[2]) > 23:
            raise ValueError(f"{text!r} is not quiet hours: write two hours 0-23 as HH-HH, e.g. 22-06")
        return cls(start=int(match[1]), end=int(match[2]))

    def end_after(self, now: datetime, zone: tzinfo) -> datetime | None:
        """When the quiet hours `now` is in end (None: `now` is not in quiet hours)."""
        local = now.astimezone(zone)
        hour = local.hour
        inside = self.start <= hour < self.end if self.start < self.end else hour >= self.start or hour < self.end
        if self.start == self.end or not inside:
            return None
        end = datetime.combine(local.date(), time(self.end), tzinfo=zone)
        if end <= local:
            end = datetime.combine(local.date() + timedelta(days=1), time(self.end), tzinfo=zone)
        return end


@dataclass(frozen=True, kw_only=True)
class NotifySettings:
    """How alerts are told: the farm's zone, the repeat interval, the flap window and the quiet hours."""

    zone: tzinfo
    repeat: timedelta
    flap: timedelta
    quiet: QuietHours | None = None


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """The morning report: when (None: off), whether an agent run writes it, the zone and the farm profile."""

    at: time | None  # FARMHOST_DAILY_REPORT, a time of day of the farm's zone
    by_agent: bool
    zone: ZoneInfo
    profile_path: Path
