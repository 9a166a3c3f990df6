"""The settings: parsed once from the environment and `.env` (`Settings`), built once into one section per service.

`load_settings` reads and checks the variables of the contract (SPEC section 7, docs/configuration.md);
`build_config` turns them into a frozen `Config` of typed sections, with what the host decides (the system time
zone, the agent runtime, the host name) looked up there once. A service is handed its own section, never the whole.
"""

from farmhost.config.agents import (
    AgentSettings,
    KindName,
    LimitSettings,
    LlmEndpoint,
    LlmSettings,
    RuntimeName,
    SandboxSettings,
)
from farmhost.config.build import Config, build_config, load_config
from farmhost.config.farm import (
    AlertThresholds,
    FarmMode,
    FarmSettings,
    HaSettings,
    NotifySettings,
    QuietHours,
    ReportSettings,
    StateSettings,
)
from farmhost.config.host import DOCKER_SOCKET, default_runtime
from farmhost.config.sections import (
    IpcSettings,
    OutboxSettings,
    SchedulerSettings,
    SiteSettings,
    TelegramSettings,
    VoiceSettings,
)
from farmhost.config.settings import (
    AGENT_UID_BASE,
    DEFAULT_MAX_REQUEST_BYTES,
    Settings,
    load_settings,
    parse_trusted_sites,
)

__all__ = [
    "AGENT_UID_BASE",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DOCKER_SOCKET",
    "AgentSettings",
    "AlertThresholds",
    "Config",
    "FarmMode",
    "FarmSettings",
    "HaSettings",
    "IpcSettings",
    "KindName",
    "LimitSettings",
    "LlmEndpoint",
    "LlmSettings",
    "NotifySettings",
    "OutboxSettings",
    "QuietHours",
    "ReportSettings",
    "RuntimeName",
    "SandboxSettings",
    "SchedulerSettings",
    "Settings",
    "SiteSettings",
    "StateSettings",
    "TelegramSettings",
    "VoiceSettings",
    "build_config",
    "default_runtime",
    "load_config",
    "load_settings",
    "parse_trusted_sites",
]
