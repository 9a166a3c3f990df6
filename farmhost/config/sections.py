"""The sections of the IPC engine, the scheduler, the outbox, the channels (Telegram, the sites on MQTT) and voice."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from farmhost.broker import Broker


@dataclass(frozen=True, kw_only=True)
class IpcSettings:
    """The IPC engine's: discovery, request size, sweeps and retention, heartbeat, the request log, this site."""

    mode: Literal["inotify", "poll"]
    site: str  # this farmhost's site: a request naming another site goes to the site row
    max_request_bytes: int
    rescan_seconds: float
    poll_seconds: float
    stale_request_seconds: float
    result_retention_hours: float
    ledger_retention_days: float
    quarantine_retention_days: float
    quarantine_max_files: int
    quarantine_max_mb: int
    heartbeat_seconds: float
    request_log_max_bytes: int


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """The scheduler's and the tasks/ queue's: the farm's zone, the grace, the alert threshold, tasks per group."""

    zone: ZoneInfo
    grace_seconds: float
    failure_alert_after: int
    tasks_per_group_max: int


@dataclass(frozen=True, kw_only=True)
class OutboxSettings:
    """The messages/ handlers': what one group's undelivered entries and file copies may hold, and the copies' pace."""

    group_max_chunks: int
    group_max_bytes: int
    file_copy_bytes_per_second: int


@dataclass(frozen=True, kw_only=True)
class TelegramSettings:
    """Telegram's: the bot, the Bot API root, polling, the main chat's senders, media, delivery attempts."""

    bot_token: str | None = field(repr=False)
    api_base_url: str | None  # a self-hosted Bot API server (None: Telegram's)
    poll_timeout: int
    main_senders: str | None  # FARMHOST_TELEGRAM_MAIN_SENDERS as written (the receiver reads the ids)
    media_max_bytes: int
    outbox_max_attempts: int
    outbox_retry_seconds: float  # the first retry's wait; doubles per failure (capped at 5 min)
    zone: ZoneInfo

    @property
    def enabled(self) -> bool:
        """Telegram is configured."""
        return bool(self.bot_token)


@dataclass(frozen=True, kw_only=True)
class SiteSettings:
    """This farmhost among the sites on MQTT: its name (resolved once at load), the broker, whom it serves."""

    name: str
    broker: Broker | None  # None: MQTT is off
    trusted: frozenset[str]  # the sites whose calls this one serves, never itself
    resend_seconds: float  # an unanswered call is sent again this often
    answer_grace_seconds: float  # the origin waits this long past a call's deadline for an answer on its way
    zone: ZoneInfo


@dataclass(frozen=True, kw_only=True)
class VoiceSettings:
    """Speech-to-text for voice notes: the embedded model or the Wyoming server, the language, the limits."""

    model: str | None  # FARMHOST_STT_MODEL: a CTranslate2 Whisper model directory, or a name faster-whisper fetches
    url: str | None  # FARMHOST_STT_URL: tcp://host:port of a Wyoming server (never set together with `model`)
    language: str | None  # None: detected per note
    max_seconds: float  # a longer note is refused before it is transcribed
    idle_seconds: float  # the embedded model's worker ends after this long without a note
    models_dir: Path  # where a model named (not a directory) is downloaded to: <data>/models

    @property
    def enabled(self) -> bool:
        """An engine is configured."""
        return self.model is not None or self.url is not None

    @property
    def host_port(self) -> tuple[str, int]:
        """The Wyoming server's host and port (`url` was checked when the settings were read)."""
        host, _, port = (self.url or "").removeprefix("tcp://").rpartition(":")
        return host.strip("[]"), int(port)
