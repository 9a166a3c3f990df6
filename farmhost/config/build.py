"""Config: the settings turned once into one typed, frozen section per service, with what the host decides resolved.

`build_config` is the only place that asks the machine about the settings (the system time zone when TZ is unset,
whether a Docker engine is there when FARMHOST_AGENT_RUNTIME is unset, the host name when FARMHOST_SITE is unset):
once, when the daemon (or a CLI command) loads its settings, never on a service's access.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from datetime import time, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from farmhost.broker import Broker, parse_broker, site_name
from farmhost.config.agents import AgentSettings, LimitSettings, LlmEndpoint, LlmSettings, SandboxSettings
from farmhost.config.farm import (
    AlertThresholds,
    FarmSettings,
    HaSettings,
    NotifySettings,
    QuietHours,
    ReportSettings,
    StateSettings,
)
from farmhost.config.host import detect_runtime, farm_zone, host_name
from farmhost.config.sections import (
    IpcSettings,
    OutboxSettings,
    SchedulerSettings,
    SiteSettings,
    TelegramSettings,
    VoiceSettings,
)
from farmhost.config.settings import Settings, load_settings, parse_trusted_sites


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every section of one daemon's settings; each service is handed its own section, never this whole."""

    data_dir: Path
    tz: str | None  # TZ as configured (None: the system zone, which `zone` holds)
    zone: ZoneInfo
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"]
    log_format: Literal["text", "json"]
    secrets: tuple[str, ...] = field(repr=False)  # tokens and keys: redacted from logs, kept out of sandboxes
    ha: HaSettings
    ipc: IpcSettings
    scheduler: SchedulerSettings
    outbox: OutboxSettings
    telegram: TelegramSettings
    agents: AgentSettings
    farm: FarmSettings
    alerts: NotifySettings
    report: ReportSettings
    site: SiteSettings
    voice: VoiceSettings


def load_config(*, data_dir: Path | None = None, env_file: str | None = ".env") -> Config:
    """`load_settings` (same arguments, same ConfigError), built into sections.

    Raises:
        ConfigError: one line naming the variable and what is wrong with it.
    """
    return build_config(load_settings(data_dir=data_dir, env_file=env_file))


def build_config(settings: Settings) -> Config:
    """The sections of `settings`, with the time zone, the agent runtime and the site name looked up once."""
    zone = farm_zone(settings.tz)
    site = site_name(settings.site or host_name())
    ha = HaSettings(url=settings.ha_url, token=settings.ha_token)
    llm = _llm(settings, zone)
    secrets = settings.secret_values()
    profile_path = settings.farm_profile_path or settings.data_dir / "farm-profile.json"
    return Config(
        data_dir=settings.data_dir,
        tz=settings.tz,
        zone=zone,
        log_level=settings.log_level,
        log_format=settings.log_format,
        secrets=secrets,
        ha=ha,
        ipc=_ipc(settings, site),
        scheduler=SchedulerSettings(
            zone=zone,
            grace_seconds=settings.task_grace_seconds,
            failure_alert_after=settings.task_failure_alert_after,
            tasks_per_group_max=settings.tasks_per_group_max,
        ),
        outbox=OutboxSettings(
            group_max_chunks=settings.outbox_group_max_chunks,
            group_max_bytes=settings.outbox_group_max_bytes,
            file_copy_bytes_per_second=settings.file_copy_bytes_per_second,
        ),
        telegram=TelegramSettings(
            bot_token=settings.telegram_bot_token,
            api_base_url=settings.telegram_api_base_url,
            poll_timeout=settings.telegram_poll_timeout,
            main_senders=settings.telegram_main_senders,
            media_max_bytes=settings.telegram_media_max_bytes,
            outbox_max_attempts=settings.outbox_max_attempts,
            outbox_retry_seconds=settings.outbox_retry_seconds,
            zone=zone,
        ),
        agents=_agents(settings, zone, llm, secrets),
        farm=_farm(settings, zone, ha, profile_path),
        alerts=NotifySettings(
            zone=zone,
            repeat=timedelta(minutes=settings.alert_repeat_minutes),
            flap=timedelta(minutes=settings.alert_flap_minutes),
            quiet=QuietHours.parse(settings.quiet_hours) if settings.quiet_hours else None,
        ),
        report=ReportSettings(
            at=time.fromisoformat(settings.daily_report) if settings.daily_report else None,
            by_agent=settings.daily_report_by_agent,
            zone=zone,
            profile_path=profile_path,
        ),
        site=SiteSettings(
            name=site,
            broker=broker_of(settings),
            trusted=parse_trusted_sites(settings.sites_trusted) - {site},
            resend_seconds=settings.site_resend_seconds,
            answer_grace_seconds=settings.site_answer_grace_seconds,
            zone=zone,
        ),
        voice=VoiceSettings(
            model=settings.stt_model,
            url=settings.stt_url,
            language=settings.stt_language,
            max_seconds=settings.stt_max_seconds,
            idle_seconds=settings.stt_idle_seconds,
            models_dir=settings.data_dir / "models",
        ),
    )


def _ipc(settings: Settings, site: str) -> IpcSettings:
    return IpcSettings(
        mode=settings.ipc_mode,
        site=site,
        max_request_bytes=settings.ipc_max_request_bytes,
        rescan_seconds=settings.ipc_rescan_seconds,
        poll_seconds=settings.ipc_poll_seconds,
        stale_request_seconds=settings.stale_request_seconds,
        result_retention_hours=settings.result_retention_hours,
        ledger_retention_days=settings.ledger_retention_days,
        quarantine_retention_days=settings.quarantine_retention_days,
        quarantine_max_files=settings.quarantine_max_files,
        quarantine_max_mb=settings.quarantine_max_mb,
        heartbeat_seconds=settings.heartbeat_seconds,
        request_log_max_bytes=settings.request_log_max_bytes,
    )


def _llm(settings: Settings, zone: ZoneInfo) -> LlmSettings:
    return LlmSettings(
        endpoints=llm_chain(settings),
        cooldown_seconds=settings.llm_cooldown_seconds,
        run_connections=settings.llm_run_connections,
        max_connections=settings.llm_max_connections,
        max_tokens=settings.llm_max_tokens,
        stream_idle_timeout=settings.llm_stream_idle_timeout,
        requests_per_day=settings.llm_requests_per_day,
        tokens_per_day=settings.llm_tokens_per_day,
        zone=zone,
        context_tokens=settings.llm_context_tokens,
    )


def _agents(settings: Settings, zone: ZoneInfo, llm: LlmSettings, secrets: tuple[str, ...]) -> AgentSettings:
    return AgentSettings(
        kind=settings.agent_kind,
        command=tuple(shlex.split(settings.agent_command)) if settings.agent_command is not None else None,
        opencode_bin=settings.opencode_bin,
        max_agents=settings.max_agents,
        output_bytes=settings.agent_output_bytes,
        memory_prompt_chars=settings.memory_prompt_chars,
        unenforced_limits=settings.agent_unenforced_limits,
        disk_reserve_mb=settings.disk_reserve_mb,
        zone=zone,
        secrets=secrets,
        limits=LimitSettings(
            timeout_seconds=settings.agent_timeout_seconds,
            memory_mb=settings.agent_memory_mb,
            pids=settings.agent_pids,
            max_turns=settings.agent_max_turns,
            tmp_mb=settings.agent_tmp_mb,
            workspace_mb=settings.agent_workspace_mb,
            cpu_percent=settings.agent_cpu_percent,
        ),
        llm=llm,
        sandbox=SandboxSettings(
            runtime=settings.agent_runtime or detect_runtime(),
            data_dir=settings.data_dir,
            image=settings.agent_image,
            python=settings.agent_python,
            seccomp=settings.sandbox_seccomp,
            proc=settings.sandbox_proc,
            uid_base=settings.agent_uid_base,
            uid_count=settings.agent_uid_count,
            max_agents=settings.max_agents,
        ),
    )


def _farm(settings: Settings, zone: ZoneInfo, ha: HaSettings, profile_path: Path) -> FarmSettings:
    ignored = frozenset(e.strip() for e in (settings.alert_ignore_entities or "").split(",") if e.strip())
    state = StateSettings(
        zone=zone,
        farm_mode=settings.farm_mode,
        poll_seconds=settings.state_poll_seconds,
        telemetry_seconds=settings.telemetry_seconds,
        inventory_seconds=settings.state_inventory_seconds,
        telemetry_retention_days=settings.telemetry_retention_days,
        calendar_days=settings.calendar_days,
        resolved_keep=settings.alert_resolved_keep,
        thresholds=AlertThresholds(
            frost_celsius=settings.alert_frost_celsius,
            soil_low_percent=settings.alert_soil_low_percent,
            unavailable_minutes=settings.alert_unavailable_minutes,
            ignored_entities=ignored,
        ),
    )
    return FarmSettings(
        profile_path=profile_path,
        mode=settings.farm_mode,
        zone=zone,
        audit_max_bytes=settings.request_log_max_bytes,
        max_pending_approvals=settings.max_pending_approvals,
        dashboard_backups=settings.dashboard_backups,
        ha=ha,
        state=state,
    )


def llm_chain(settings: Settings) -> tuple[LlmEndpoint, ...]:
    """The configured LLM endpoints in the order the proxy tries them (empty: no LLM).

    The parser checked that each fallback has its base URL and model and that the one before it is configured,
    so the chain is every endpoint with both.
    """
    return tuple(
        LlmEndpoint(number, url, model, key, vision=vision)
        for number, url, model, key, vision in settings.llm_fields()
        if url and model
    )


def broker_of(settings: Settings) -> Broker | None:
    """The broker of FARMHOST_MQTT_URL with its TLS files; None when MQTT is off."""
    if not settings.mqtt_url:
        return None
    broker = parse_broker(settings.mqtt_url)  # valid: checked when the settings were read
    return replace(
        broker, ca_file=settings.mqtt_ca_file, cert_file=settings.mqtt_cert_file, key_file=settings.mqtt_key_file
    )
