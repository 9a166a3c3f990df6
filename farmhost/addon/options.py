"""The add-on's options: /data/options.json as the Supervisor writes it, read with one log line per bad option.

The schema the farmer fills in is addon-farmhost/config.yaml's; this model is the daemon's side of it. An option
that is missing or wrong is reported by name and left at its default, so the rest of farmhost still starts.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

logger = logging.getLogger(__name__)

OPTIONS_PATH: Final = Path("/data/options.json")
_NEEDED: Final = ("telegram_bot_token", "main_chat_id", "llm_base_url", "llm_model")


class AddonOptions(BaseModel):
    """What Home Assistant cannot give farmhost: Telegram, the main chat, the LLM, the farm profile."""

    # A value pasted with a space or line break around it would reach Telegram's URL or the LLM's header as is.
    model_config = ConfigDict(extra="ignore", frozen=True, str_strip_whitespace=True)

    telegram_bot_token: str | None = Field(default=None, min_length=1, repr=False)
    # Telegram chat ids are integers: negative for groups (-100... for supergroups), positive for a private chat.
    main_chat_id: int | None = None
    main_chat_name: str = Field(default="Farm office", min_length=1, max_length=100)
    llm_base_url: str | None = None
    llm_model: str | None = Field(default=None, min_length=1)
    llm_api_key: str | None = Field(default=None, repr=False)
    farm_mode: Literal["demo", "production"] = "demo"
    # A file name in the add-on's config folder (/config here, addon_configs/<slug> in HA's file editor or Samba).
    farm_profile: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.json$")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("*")
    @classmethod
    def _one_line(cls, value: object) -> object:
        # Each value goes into farmhost's environment and command lines: a NUL cannot be there at all (the add-on
        # stopped with a traceback), and a line break or other control character is no token, URL, model or name.
        if isinstance(value, str) and any(unicodedata.category(c) == "Cc" for c in value):
            raise ValueError("must be one line of text, without control characters")
        return value

    @field_validator("llm_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/") if value else value


def read_options(path: Path = OPTIONS_PATH) -> tuple[AddonOptions, list[str]]:
    """The options in `path` and one sentence per option that is missing or wrong (also logged as a warning).

    Never raises for bad content: an unreadable file gives the defaults and says why.
    """
    problems: list[str] = []
    raw: dict[str, Any] = {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        problems.append(f"{path} cannot be read ({err}): every option is at its default")
    else:
        if isinstance(loaded, dict):
            raw = {key: value for key, value in loaded.items() if value not in (None, "")}
        else:
            problems.append(f"{path} holds {type(loaded).__name__}, not an object: every option is at its default")
    try:
        options = AddonOptions.model_validate(raw)
    except ValidationError as err:
        bad: set[str] = set()
        for error in err.errors():
            name = str(error["loc"][0]) if error["loc"] else "?"
            bad.add(name)
            problems.append(f"option {name}: {error['msg']} (got {_shown(name, raw.get(name))}); its default is used")
        options = AddonOptions.model_validate({k: v for k, v in raw.items() if k not in bad})
    for name in _NEEDED:
        if getattr(options, name) is None and not any(p.startswith(f"option {name}:") for p in problems):
            problems.append(f"option {name} is missing: {_WHAT_IS_OFF[name]}")
    for line in problems:
        logger.warning("%s", line)
    return options, problems


_WHAT_IS_OFF: Final = {
    "telegram_bot_token": "farmhost does not talk to Telegram until it is set (BotFather gives one)",
    "main_chat_id": "no main chat is registered, so nobody can talk to farmhost until it is set",
    "llm_base_url": "agents do not run; chat messages are answered by Home Assistant's Assist",
    "llm_model": "agents do not run; chat messages are answered by Home Assistant's Assist",
}


def _shown(name: str, value: object) -> str:
    """A value for a log line: secrets are never shown, only their kind."""
    if name in ("telegram_bot_token", "llm_api_key"):
        return f"a {type(value).__name__}"
    return repr(value)[:80]
