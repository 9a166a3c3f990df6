"""Settings: the one parser of the environment and `.env` (names, defaults, validation, one-line errors).

Nothing but the entry points reads a Settings: `build_config` (config/build.py) turns it into the sections the
services receive.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from farmhost.broker import parse_broker
from farmhost.config.agents import KindName, RuntimeName
from farmhost.config.farm import AlertThresholds, FarmMode
from farmhost.errors import ConfigError
from farmhost.protocol.codes import SITE_RE

DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
# 0x70000000: the first id past systemd-nspawn's container ranges, in the span systemd's uid table leaves unused.
AGENT_UID_BASE: Final = 0x7000_0000


class Settings(BaseSettings):
    """Every setting of the appliance; names match the environment variables of the contract.

    Precedence: command-line option (applied by the CLI with `model_copy`) > environment > `.env` > default.
    A missing optional setting (HA, Telegram, LLM) switches its part off; `farmhost doctor` says so. An empty value
    (`FARMHOST_IPC_MODE=` in a shell, a compose file or `.env`) is a missing one: the default holds, or the part
    is off, for every setting alike.
    """

    model_config = SettingsConfigDict(
        env_file=".env", env_ignore_empty=True, extra="ignore", frozen=True, populate_by_name=True
    )

    data_dir: Path = Field(default=Path("./data"), validation_alias="FARMHOST_DATA_DIR")
    tz: str | None = Field(default=None, validation_alias="TZ")
    ha_url: str | None = Field(default=None, validation_alias="HA_URL")
    ha_token: str | None = Field(default=None, validation_alias="HA_TOKEN", repr=False)
    farm_mode: FarmMode = Field(default="demo", validation_alias="FARM_MODE")
    farm_profile_path: Path | None = Field(default=None, validation_alias="FARM_PROFILE_PATH")
    # 3: enough for an agent's plan (pump, valve, duration) while no approver has to read a wall of requests.
    max_pending_approvals: int = Field(default=3, ge=1, le=100, validation_alias="FARMHOST_MAX_PENDING_APPROVALS")
    telegram_bot_token: str | None = Field(default=None, validation_alias="TELEGRAM_BOT_TOKEN", repr=False)
    telegram_api_base_url: str | None = Field(default=None, validation_alias="TELEGRAM_API_BASE_URL")
    agent_runtime: RuntimeName | None = Field(default=None, validation_alias="FARMHOST_AGENT_RUNTIME")
    agent_image: str = Field(default="farmhost-agent:latest", validation_alias="FARMHOST_AGENT_IMAGE")
    max_agents: int = Field(default=2, ge=1, le=64, validation_alias="FARMHOST_MAX_AGENTS")
    llm_base_url: str | None = Field(default=None, validation_alias="FARMHOST_LLM_BASE_URL")
    llm_api_key: str | None = Field(default=None, validation_alias="FARMHOST_LLM_API_KEY", repr=False)
    llm_model: str | None = Field(default=None, validation_alias="FARMHOST_LLM_MODEL")
    # The endpoint's model accepts images: a chat photo goes to the agent as an image part (docs/agent-runtime.md).
    llm_vision: bool = Field(default=False, validation_alias="FARMHOST_LLM_VISION")
    ipc_mode: Literal["inotify", "poll"] = Field(default="inotify", validation_alias="FARMHOST_IPC_MODE")
    mqtt_url: str | None = Field(default=None, validation_alias="FARMHOST_MQTT_URL", repr=False)
    site: str | None = Field(default=None, validation_alias="FARMHOST_SITE")
    # The other sites whose calls this one serves (comma-separated site names): their broker logins are the only
    # ones whose farm actions run here (docs/mqtt.md). Unset trusts none: a site serves nobody until told whom.
    sites_trusted: str | None = Field(default=None, validation_alias="FARMHOST_SITES_TRUSTED")
    # How often a call another site has not answered yet is sent again (besides every reconnect and the target
    # coming back online); tests shorten it to see several resends in seconds.
    site_resend_seconds: float = Field(default=10.0, gt=0, le=600, validation_alias="FARMHOST_SITE_RESEND_SECONDS")
    # How long past a call's deadline the origin still waits for an answer that was on its way; tests shorten it.
    site_answer_grace_seconds: float = Field(
        default=5.0, ge=0, le=60, validation_alias="FARMHOST_SITE_ANSWER_GRACE_SECONDS"
    )
    # TLS to the broker (mqtts://): the CA that signed the broker's certificate, and this site's client
    # certificate and key when the broker logs sites in by certificate (docs/mqtt.md)
    mqtt_ca_file: Path | None = Field(default=None, validation_alias="FARMHOST_MQTT_CA_FILE")
    mqtt_cert_file: Path | None = Field(default=None, validation_alias="FARMHOST_MQTT_CERT_FILE")
    mqtt_key_file: Path | None = Field(default=None, validation_alias="FARMHOST_MQTT_KEY_FILE")

    # farmhost's own knobs (not in the contract's table, documented in docs/configuration.md)
    # Agent runs: defaults for every group; <data>/agent-limits.json may override them per group.
    agent_timeout_seconds: float = Field(
        default=600.0, gt=0, le=86400, validation_alias="FARMHOST_AGENT_TIMEOUT_SECONDS"
    )
    agent_memory_mb: int = Field(default=1024, ge=64, le=65536, validation_alias="FARMHOST_AGENT_MEMORY_MB")
    agent_pids: int = Field(default=256, ge=8, le=65536, validation_alias="FARMHOST_AGENT_PIDS")
    agent_tmp_mb: int = Field(default=256, ge=1, le=65536, validation_alias="FARMHOST_AGENT_TMP_MB")
    agent_workspace_mb: int = Field(default=1024, ge=1, le=1048576, validation_alias="FARMHOST_AGENT_WORKSPACE_MB")
    # Free space a run must leave on the filesystems it writes to (the data directory's): under it, it is ended.
    disk_reserve_mb: int = Field(default=256, ge=0, le=1048576, validation_alias="FARMHOST_DISK_RESERVE_MB")
    agent_cpu_percent: int = Field(default=100, ge=1, le=6400, validation_alias="FARMHOST_AGENT_CPU_PERCENT")
    # Where the host cannot hold memory, process and CPU limits per run (no cgroup for the daemon), runs are
    # refused unless the operator allows them to start with only the limits that do hold.
    agent_unenforced_limits: Literal["refuse", "allow"] = Field(
        default="refuse", validation_alias="FARMHOST_AGENT_UNENFORCED_LIMITS"
    )
    agent_output_bytes: int = Field(default=1 << 20, ge=4096, validation_alias="FARMHOST_AGENT_OUTPUT_BYTES")
    agent_max_turns: int = Field(default=12, ge=1, le=100, validation_alias="FARMHOST_AGENT_MAX_TURNS")
    agent_python: Path | None = Field(default=None, validation_alias="FARMHOST_AGENT_PYTHON")
    # What a run starts (docs/agent-runtime.md#agent-kinds): the built-in runner, or any program of the operator's.
    agent_kind: KindName = Field(default="farmagent", validation_alias="FARMHOST_AGENT_KIND")
    agent_command: str | None = Field(default=None, validation_alias="FARMHOST_AGENT_COMMAND")
    opencode_bin: Path | None = Field(default=None, validation_alias="FARMHOST_OPENCODE_BIN")
    # A root daemon gives each group's runs their own uid (= gid) from [base, base+count) (docs/security.md): above
    # shadow's subordinate ids (100000-600100000) and systemd-nspawn's (524288-1879048191), in the span systemd
    # leaves unused, below 2^31.
    agent_uid_base: int = Field(
        default=AGENT_UID_BASE, ge=65536, le=2**31 - 2, validation_alias="FARMHOST_AGENT_UID_BASE"
    )
    agent_uid_count: int = Field(default=65536, ge=1, le=2**24, validation_alias="FARMHOST_AGENT_UID_COUNT")
    # bwrap runs: `required` refuses to start agents when the seccomp filter cannot be built, `off` runs them without.
    sandbox_seccomp: Literal["required", "off"] = Field(default="required", validation_alias="FARMHOST_SANDBOX_SECCOMP")
    # bwrap runs: `new` mounts a /proc of the run's own pid namespace; `container` binds the /proc farmhost sees,
    # read-only, for a container (the Home Assistant add-on) whose masked /proc paths forbid mounting a new one.
    sandbox_proc: Literal["new", "container"] = Field(default="new", validation_alias="FARMHOST_SANDBOX_PROC")
    # The LLM proxy (docs/agent-runtime.md): connections a run may hold and all runs together, so a flood of them
    # can never take the daemon to its descriptor limit; an agent's client needs one or two.
    # Fallback LLM endpoints, tried in this order after FARMHOST_LLM_BASE_URL/MODEL/API_KEY (agent-runtime.md): e.g. a
    # hosted model first, then a llama.cpp or Ollama server on the farm's own network for when the internet is down.
    llm_2_base_url: str | None = Field(default=None, validation_alias="FARMHOST_LLM_2_BASE_URL")
    llm_2_model: str | None = Field(default=None, validation_alias="FARMHOST_LLM_2_MODEL")
    llm_2_api_key: str | None = Field(default=None, validation_alias="FARMHOST_LLM_2_API_KEY", repr=False)
    llm_2_vision: bool = Field(default=False, validation_alias="FARMHOST_LLM_2_VISION")
    llm_3_base_url: str | None = Field(default=None, validation_alias="FARMHOST_LLM_3_BASE_URL")
    llm_3_model: str | None = Field(default=None, validation_alias="FARMHOST_LLM_3_MODEL")
    llm_3_api_key: str | None = Field(default=None, validation_alias="FARMHOST_LLM_3_API_KEY", repr=False)
    llm_3_vision: bool = Field(default=False, validation_alias="FARMHOST_LLM_3_VISION")
    # An endpoint that failed (no connection, a timeout, a 5xx) is tried last for this long: long enough that a
    # run does not wait for a dead hosted endpoint at every turn, short enough to be back soon after the internet.
    llm_cooldown_seconds: float = Field(default=120.0, ge=0, le=86400, validation_alias="FARMHOST_LLM_COOLDOWN_SECONDS")
    llm_run_connections: int = Field(default=8, ge=1, le=1024, validation_alias="FARMHOST_LLM_RUN_CONNECTIONS")
    llm_max_connections: int = Field(default=64, ge=1, le=4096, validation_alias="FARMHOST_LLM_MAX_CONNECTIONS")
    # Each request's max_tokens is capped to this (and set to it when the agent sends none): a turn's answer is a
    # tool call or a reply of a few hundred tokens, and the cap bounds what one request can cost.
    llm_max_tokens: int = Field(default=4096, ge=16, le=1_000_000, validation_alias="FARMHOST_LLM_MAX_TOKENS")
    # The model's context (llama-server -c, Ollama num_ctx): the built-in runner never sends a longer prompt. Set by
    # hand rather than asked of the server: the proxy forwards only completions, and a fallback may differ.
    llm_context_tokens: int | None = Field(
        default=None, ge=512, le=10_000_000, validation_alias="FARMHOST_LLM_CONTEXT_TOKENS"
    )
    # A stream is cut when the upstream sends nothing for this long (the whole stream is bounded by the 300 s request
    # timeout): a hosted model sends a token every few ms, a small machine may read a long prompt for a minute first.
    llm_stream_idle_timeout: float = Field(
        default=90.0, gt=0, le=3600, validation_alias="FARMHOST_LLM_STREAM_IDLE_TIMEOUT"
    )
    # Per group per day (the farm's time zone), persisted across restarts; agent-limits.json may override them.
    # 500 requests is ten full 12-turn runs and more; 2M tokens bounds a day's cost on a hosted model.
    llm_requests_per_day: int = Field(default=500, ge=1, le=1_000_000, validation_alias="FARMHOST_LLM_REQUESTS_PER_DAY")
    llm_tokens_per_day: int = Field(
        default=2_000_000, ge=1, le=10_000_000_000, validation_alias="FARMHOST_LLM_TOKENS_PER_DAY"
    )
    # The morning report: HH:MM of the farm's time zone (None: off); with `by_agent`, an agent run writes it from
    # the same facts (the plain report is sent if that run fails).
    daily_report: str | None = Field(default=None, validation_alias="FARMHOST_DAILY_REPORT")
    daily_report_by_agent: bool = Field(default=False, validation_alias="FARMHOST_DAILY_REPORT_BY_AGENT")
    memory_prompt_chars: int = Field(default=2000, ge=0, le=50000, validation_alias="FARMHOST_MEMORY_PROMPT_CHARS")
    # Telegram: long-poll length, who may talk to the main chat, inbound media cap, outbox delivery attempts.
    telegram_poll_timeout: int = Field(default=30, ge=0, le=300, validation_alias="FARMHOST_TELEGRAM_POLL_TIMEOUT")
    telegram_main_senders: str | None = Field(default=None, validation_alias="FARMHOST_TELEGRAM_MAIN_SENDERS")
    telegram_media_max_bytes: int = Field(
        default=20 * 1024 * 1024, ge=0, validation_alias="FARMHOST_TELEGRAM_MEDIA_MAX_BYTES"
    )
    # Unsent file copies one group may keep in the outbox: without it a group could fill the disk while offline.
    outbox_group_max_bytes: int = Field(
        default=200 * 1024 * 1024, ge=0, validation_alias="FARMHOST_OUTBOX_GROUP_MAX_BYTES"
    )
    # Undelivered chunks and files one group may have in the outbox: Telegram sends about 20 messages a minute in
    # a group, so past this an agent's flood would fill the database and hold its chat for hours.
    outbox_group_max_chunks: int = Field(default=1000, ge=1, validation_alias="FARMHOST_OUTBOX_GROUP_MAX_CHUNKS")
    # All groups' file copies into the outbox together; an SD card writes 10-40 MB/s, a Telegram upload is slower.
    file_copy_bytes_per_second: int = Field(
        default=32 * 1024 * 1024, ge=0, validation_alias="FARMHOST_FILE_COPY_BYTES_PER_SECOND"
    )
    outbox_max_attempts: int = Field(default=8, ge=1, le=100, validation_alias="FARMHOST_OUTBOX_MAX_ATTEMPTS")
    outbox_retry_seconds: float = Field(default=2.0, ge=0.01, le=300, validation_alias="FARMHOST_OUTBOX_RETRY_SECONDS")
    # Scheduler: a run missed while the host was down still runs at start if it is at most this late.
    task_grace_seconds: float = Field(default=900.0, ge=0, validation_alias="FARMHOST_TASK_GRACE_SECONDS")
    # Each task is a job in the scheduler and a line in main's current_tasks.json, rewritten at every change.
    tasks_per_group_max: int = Field(default=100, ge=1, le=10000, validation_alias="FARMHOST_TASKS_PER_GROUP")
    task_failure_alert_after: int = Field(default=3, ge=1, le=100, validation_alias="FARMHOST_TASK_FAILURE_ALERT_AFTER")
    ipc_max_request_bytes: int = Field(
        default=DEFAULT_MAX_REQUEST_BYTES, ge=1024, validation_alias="FARMHOST_IPC_MAX_REQUEST_BYTES"
    )
    # 5 s: a missed inotify event costs at most this much latency, and a scan of 16 idle groups is ~1 ms.
    ipc_rescan_seconds: float = Field(default=5.0, gt=0, le=3600, validation_alias="FARMHOST_IPC_RESCAN_SECONDS")
    ipc_poll_seconds: float = Field(default=0.5, gt=0, le=60, validation_alias="FARMHOST_IPC_POLL_SECONDS")
    stale_request_seconds: float = Field(default=3600, gt=0, validation_alias="FARMHOST_STALE_REQUEST_SECONDS")
    result_retention_hours: float = Field(default=24, gt=0, validation_alias="FARMHOST_RESULT_RETENTION_HOURS")
    ledger_retention_days: float = Field(default=30, gt=0, validation_alias="FARMHOST_LEDGER_RETENTION_DAYS")
    quarantine_retention_days: float = Field(default=30, gt=0, validation_alias="FARMHOST_QUARANTINE_RETENTION_DAYS")
    # What one group's quarantine may hold (farmhost/ipc/quarantine.py says why these defaults).
    quarantine_max_files: int = Field(
        default=1000, ge=1, le=1_000_000, validation_alias="FARMHOST_QUARANTINE_MAX_FILES"
    )
    quarantine_max_mb: int = Field(default=32, ge=1, le=1_000_000, validation_alias="FARMHOST_QUARANTINE_MAX_MB")
    heartbeat_seconds: float = Field(default=5.0, gt=0, le=300, validation_alias="FARMHOST_HEARTBEAT_SECONDS")
    request_log_max_bytes: int = Field(default=10 * 1024 * 1024, ge=4096, validation_alias="FARMHOST_REQUEST_LOG_BYTES")
    dashboard_backups: int = Field(default=10, ge=1, le=1000, validation_alias="FARMHOST_DASHBOARD_BACKUPS")
    # farm state collector (docs/farm-state.md)
    # 30 s: a soil probe or thermometer changes over minutes, and two small REST calls every 30 s cost HA nothing.
    state_poll_seconds: float = Field(default=30.0, gt=0, validation_alias="FARMHOST_STATE_POLL_SECONDS")
    # 5 min: fine enough to plot a day of moisture or a frost night, 288 lines a day per file.
    telemetry_seconds: float = Field(default=300.0, gt=0, validation_alias="FARMHOST_TELEMETRY_SECONDS")
    # 5 min: devices, areas and calendar events change rarely; an explicit farm_state_refresh picks changes up at once.
    state_inventory_seconds: float = Field(default=300.0, gt=0, validation_alias="FARMHOST_STATE_INVENTORY_SECONDS")
    # 90 days: a season of telemetry for comparing this week with last month, a few MB in all.
    telemetry_retention_days: int = Field(default=90, ge=1, validation_alias="FARMHOST_TELEMETRY_RETENTION_DAYS")
    # 14 days: the planning horizon of farm work (spraying, harvest, deliveries) an agent needs from the calendar.
    calendar_days: int = Field(default=14, ge=1, le=366, validation_alias="FARMHOST_CALENDAR_DAYS")
    # 50: a few days of history at a busy farm, so an agent can see what happened overnight; the file stays small.
    alert_resolved_keep: int = Field(default=50, ge=0, validation_alias="FARMHOST_ALERT_RESOLVED_KEEP")
    # the alert rules' thresholds: config/farm.py's AlertThresholds says why these defaults
    alert_frost_celsius: float = Field(
        default=AlertThresholds.frost_celsius, validation_alias="FARMHOST_ALERT_FROST_CELSIUS"
    )
    alert_soil_low_percent: float = Field(
        default=AlertThresholds.soil_low_percent, ge=0, le=100, validation_alias="FARMHOST_ALERT_SOIL_LOW_PERCENT"
    )
    alert_unavailable_minutes: float = Field(
        default=AlertThresholds.unavailable_minutes, ge=0, validation_alias="FARMHOST_ALERT_UNAVAILABLE_MINUTES"
    )
    alert_ignore_entities: str | None = Field(default=None, validation_alias="FARMHOST_ALERT_IGNORE_ENTITIES")
    # alerts told to the chats (docs/telegram.md#farm-alerts)
    alert_repeat_minutes: float = Field(default=15.0, gt=0, le=1440, validation_alias="FARMHOST_ALERT_REPEAT_MINUTES")
    alert_flap_minutes: float = Field(default=10.0, ge=0, le=1440, validation_alias="FARMHOST_ALERT_FLAP_MINUTES")
    quiet_hours: str | None = Field(default=None, validation_alias="FARMHOST_QUIET_HOURS")
    # Voice notes (docs/voice.md): the embedded Whisper model or a Wyoming server, never both; off when neither.
    stt_model: str | None = Field(default=None, validation_alias="FARMHOST_STT_MODEL")
    stt_url: str | None = Field(default=None, validation_alias="FARMHOST_STT_URL")
    stt_language: str | None = Field(default=None, validation_alias="FARMHOST_STT_LANGUAGE")
    # 120 s: a spoken instruction takes well under a minute; a longer note costs the farm computer minutes of CPU.
    stt_max_seconds: float = Field(default=120.0, gt=0, le=3600, validation_alias="FARMHOST_STT_MAX_SECONDS")
    # 300 s: a conversation's notes reuse the loaded model; the worker's ~200 MB go back to the farm after it.
    stt_idle_seconds: float = Field(default=300.0, ge=0, le=86400, validation_alias="FARMHOST_STT_IDLE_SECONDS")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", validation_alias="FARMHOST_LOG_LEVEL"
    )
    log_format: Literal["text", "json"] = Field(default="text", validation_alias="FARMHOST_LOG_FORMAT")

    @field_validator("daily_report")
    @classmethod
    def _clock_time(cls, value: str | None) -> str | None:
        if not value or value.strip().lower() in ("off", "false", "0", "no"):
            return None
        match = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", value.strip())
        if match is None:
            raise ValueError(f"must be a time of day as HH:MM in the farm's time zone, such as 07:00 (got {value!r})")
        return f"{int(match[1]):02d}:{match[2]}"

    @field_validator("tz")
    @classmethod
    def _tz_exists(cls, value: str | None) -> str | None:
        if not value:
            return None
        name = value.removeprefix(":")
        if name.startswith("/"):  # TZ=:/etc/localtime form: the system zone
            return None
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("unknown time zone (use an IANA name such as Europe/Lisbon)") from None
        return name

    @field_validator("llm_context_tokens", mode="before")
    @classmethod
    def _context_tokens(cls, value: object) -> object:
        # blank (spaces only): unset, as an empty value is for every setting
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("quiet_hours")
    @classmethod
    def _quiet_hours(cls, value: str | None) -> str | None:
        if not value or not value.strip():
            return None
        match = re.fullmatch(r"\s*([0-9]{1,2})\s*-\s*([0-9]{1,2})\s*", value)
        if match is None or int(match[1]) > 23 or int(match[2]) > 23:
            raise ValueError("write two hours 0-23 of the farm's time zone as HH-HH, e.g. 22-06")
        return value.strip()

    @field_validator("ha_url", "telegram_api_base_url", "llm_base_url", "llm_2_base_url", "llm_3_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("mqtt_url")
    @classmethod
    def _mqtt_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            parse_broker(value)
        except ConfigError as err:
            raise ValueError(err.message.removeprefix("FARMHOST_MQTT_URL ")) from None
        return value

    @field_validator("site")
    @classmethod
    def _site(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not SITE_RE.fullmatch(value):
            raise ValueError("must be 1-63 lower-case letters, digits, - and _ (one MQTT topic level), e.g. pump-house")
        return value

    @field_validator("sites_trusted")
    @classmethod
    def _trusted_sites(cls, value: str | None) -> str | None:
        parse_trusted_sites(value)
        return value or None

    @field_validator("stt_model")
    @classmethod
    def _stt_model(cls, value: str | None) -> str | None:
        return value.strip() if value and value.strip() else None

    @field_validator("stt_url")
    @classmethod
    def _stt_url(cls, value: str | None) -> str | None:
        if not value or not value.strip():
            return None
        match = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})", value.strip())
        if match is None or not 0 < int(match[2]) < 65536:
            raise ValueError("must be tcp://host:port of a Wyoming speech-to-text server, e.g. tcp://127.0.0.1:10300")
        return value.strip()

    @field_validator("stt_language")
    @classmethod
    def _stt_language(cls, value: str | None) -> str | None:
        if not value or value.strip().lower() in ("", "auto", "detect"):
            return None
        if not re.fullmatch(r"[a-z]{2,3}", value.strip().lower()):
            raise ValueError("must be a language code such as en, pt or es (or auto to detect it per note)")
        return value.strip().lower()

    @field_validator("agent_command")
    @classmethod
    def _shell_words(cls, value: str | None) -> str | None:
        if not value or not value.strip():
            return None
        try:
            shlex.split(value)
        except ValueError as err:
            raise ValueError(f"not valid shell words: {err}") from None
        return value

    @model_validator(mode="after")
    def _mqtt_tls_files(self) -> Settings:
        files = {"FARMHOST_MQTT_CA_FILE": self.mqtt_ca_file, "FARMHOST_MQTT_CERT_FILE": self.mqtt_cert_file,
                 "FARMHOST_MQTT_KEY_FILE": self.mqtt_key_file}  # fmt: skip
        named = [name for name, path in files.items() if path is not None]
        if named and not (self.mqtt_url or "").startswith("mqtts://"):
            raise ValueError(f"{named[0]} is for TLS: FARMHOST_MQTT_URL must start with mqtts://")
        if (self.mqtt_cert_file is None) != (self.mqtt_key_file is None):
            raise ValueError("FARMHOST_MQTT_CERT_FILE and FARMHOST_MQTT_KEY_FILE go together (the client certificate)")
        return self

    @model_validator(mode="after")
    def _one_stt_engine(self) -> Settings:
        if self.stt_model is not None and self.stt_url is not None:
            raise ValueError(
                "FARMHOST_STT_MODEL and FARMHOST_STT_URL are both set: keep one (the model runs on this computer, "
                "the URL sends voice notes to that Wyoming server)"
            )
        return self

    @model_validator(mode="after")
    def _agent_id_range(self) -> Settings:
        if self.agent_uid_base + self.agent_uid_count > 2**31 - 1:
            raise ValueError(
                f"FARMHOST_AGENT_UID_BASE + FARMHOST_AGENT_UID_COUNT ({self.agent_uid_base + self.agent_uid_count}) "
                "must stay below 2147483647 (ids past 2^31 break tools that read them as signed numbers)"
            )
        return self

    @model_validator(mode="after")
    def _command_for_its_kind(self) -> Settings:
        if self.agent_kind == "command" and self.agent_command is None:
            raise ValueError("FARMHOST_AGENT_KIND=command needs FARMHOST_AGENT_COMMAND (the agent's argv)")
        return self

    @model_validator(mode="after")
    def _fallbacks_in_order(self) -> Settings:
        configured = True
        previous = ""
        for number, url, model, key, vision in self.llm_fields():
            prefix = "FARMHOST_LLM" if number == 1 else f"FARMHOST_LLM_{number}"
            if number == 1:
                configured = bool(url and model)
            elif url or model or key or vision:
                if not (url and model):
                    missing = f"{prefix}_BASE_URL" if not url else f"{prefix}_MODEL"
                    raise ValueError(f"the fallback LLM endpoint {number} needs {missing} too")
                if not configured:
                    raise ValueError(
                        f"{prefix}_BASE_URL is a fallback tried after {previous}_BASE_URL and {previous}_MODEL, "
                        "which are not set"
                    )
            else:
                configured = False
            previous = prefix
        return self

    def secret_values(self) -> tuple[str, ...]:
        """Every token, key and password set: redacted from the logs, kept out of the sandboxes."""
        keys = (key for _number, _url, _model, key, _vision in self.llm_fields())
        broker_password = parse_broker(self.mqtt_url).password if self.mqtt_url else None
        return tuple(s for s in (self.ha_token, self.telegram_bot_token, *keys, broker_password) if s)

    def llm_fields(self) -> tuple[tuple[int, str | None, str | None, str | None, bool], ...]:
        """Each LLM endpoint's place, base URL, model, key and vision as written, in the order they are tried."""
        return (
            (1, self.llm_base_url, self.llm_model, self.llm_api_key, self.llm_vision),
            (2, self.llm_2_base_url, self.llm_2_model, self.llm_2_api_key, self.llm_2_vision),
            (3, self.llm_3_base_url, self.llm_3_model, self.llm_3_api_key, self.llm_3_vision),
        )


def parse_trusted_sites(raw: str | None) -> frozenset[str]:
    """The site names of FARMHOST_SITES_TRUSTED (separated by commas or spaces; empty or unset: none).

    Raises:
        ValueError: an entry is not a site name.
    """
    names = {part for part in re.split(r"[,\s]+", (raw or "").strip()) if part}
    for name in sorted(names):
        if not SITE_RE.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a site name (1-63 lower-case letters, digits, - and _, as the site's FARMHOST_SITE)"
            )
    return frozenset(names)


def load_settings(*, data_dir: Path | None = None, env_file: str | None = ".env") -> Settings:
    """Read the settings, with `data_dir` (from `--data-dir`) overriding FARMHOST_DATA_DIR.

    Raises:
        ConfigError: one line naming the variable and what is wrong with it.
    """
    try:
        settings = Settings(_env_file=env_file)  # type: ignore[call-arg]
    except UnicodeDecodeError as err:  # only the env file is decoded here: a value of the environment is text
        where = f"byte {err.object[err.start]:#04x} at position {err.start}"
        raise ConfigError(
            f"{os.path.abspath(env_file or '.env')} is not UTF-8 text ({where}): save it as UTF-8 "
            '(an editor\'s "ANSI" or "Unicode"/UTF-16 encoding is not read)'
        ) from None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if not first["loc"]:  # a rule about several settings at once: its message names them
            raise ConfigError(_plain(first["msg"])) from None
        field = str(first["loc"][0])
        secret = {str(info.validation_alias) for info in Settings.model_fields.values() if not info.repr}
        shown = "" if field in secret else f" (got {first.get('input')!r})"  # a URL or token may hold a password
        raise ConfigError(f"{field}: {_plain(first['msg'])}{shown}") from None
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    return settings.model_copy(update={"data_dir": Path(os.path.abspath(settings.data_dir))})


def _plain(message: str) -> str:
    return message.removeprefix("Value error, ")
