""".env.example: every setting of farmhost/config.py, nothing else but docker-compose.yml's own variables, valid values."""

from __future__ import annotations

import re
from pathlib import Path

from farmhost.config import Settings, build_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / ".env.example"
ASSIGNMENT = re.compile(r"^#?([A-Z][A-Z0-9_]*)=(.*)$")


def _assignments() -> list[tuple[str, str]]:
    """(name, value) of every `NAME=value` and commented `#NAME=value` line."""
    return [
        (m.group(1), m.group(2))
        for line in EXAMPLE.read_text(encoding="utf-8").splitlines()
        if (m := ASSIGNMENT.match(line))
    ]


def _setting_names() -> set[str]:
    names = set()
    for field in Settings.model_fields.values():
        assert isinstance(field.validation_alias, str), field
        names.add(field.validation_alias)
    return names


def _compose_variables() -> set[str]:
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", (REPO / "docker-compose.yml").read_text(encoding="utf-8")))


def test_every_setting_is_in_the_example() -> None:
    listed = [name for name, _ in _assignments()]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({n for n in listed if listed.count(n) > 1})}"
    missing = _setting_names() - set(listed)
    assert not missing, f"settings of farmhost/config.py missing from .env.example: {sorted(missing)}"


def test_every_variable_of_the_example_is_a_setting_or_a_compose_variable() -> None:
    settings, compose = _setting_names(), _compose_variables()
    unknown = {name for name, _ in _assignments()} - settings - compose
    assert not unknown, f".env.example names variables nothing reads: {sorted(unknown)}"
    # ...and every variable docker-compose.yml substitutes is explained there too.
    assert compose <= {name for name, _ in _assignments()}, sorted(compose - {n for n, _ in _assignments()})


def test_every_variable_of_the_configuration_doc_is_in_the_example() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    table_rows = [line for line in doc.splitlines() if line.startswith("| `")]
    documented = {name for row in table_rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split("|")[1])}
    assert {"FARMHOST_DATA_DIR", "HA_TOKEN", "FARMHOST_LOG_LEVEL"} <= documented  # the parse found the tables
    assert documented == _setting_names(), (
        f"in the doc, not a setting: {sorted(documented - _setting_names())}; "
        f"a setting the doc lacks: {sorted(_setting_names() - documented)}"
    )


def test_each_setting_has_an_explanation_above_it() -> None:
    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if ASSIGNMENT.match(line):
            above = lines[:index]
            comment = next((ln for ln in reversed(above) if not ASSIGNMENT.match(ln)), "")
            assert comment.startswith("# ") and len(comment) > 10, f"no explanation above {line!r}"


def test_the_example_values_are_valid_settings_and_everything_is_off_by_default() -> None:
    values = {name: value for name, value in _assignments() if name in _setting_names()}
    del values["FARMHOST_STT_MODEL"]  # the alternative to FARMHOST_STT_URL: never both (tests/voice)
    # Every value shown, switched on at once, is accepted (init values win over the environment and .env).
    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg]
    assert settings.max_agents == 2 and settings.agent_memory_mb == 1024 and settings.heartbeat_seconds == 5
    config = build_config(settings)
    assert config.ha.enabled and config.telegram.enabled and config.agents.llm.enabled and config.voice.enabled
    assert [endpoint.number for endpoint in config.agents.llm.endpoints] == [1, 2, 3]  # the fallbacks, in order
    # Copied as it is, the file sets nothing: every line is commented out, so defaults and "off" apply.
    active = [line for line in EXAMPLE.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert active == []


def test_the_shown_values_of_knobs_are_their_defaults() -> None:
    """A `#NAME=value` line of a knob with a default shows that default, so uncommenting it changes nothing."""
    examples_not_defaults = {
        "TZ", "HA_URL", "HA_TOKEN", "FARM_PROFILE_PATH", "TELEGRAM_BOT_TOKEN", "TELEGRAM_API_BASE_URL",
        "FARMHOST_TELEGRAM_MAIN_SENDERS", "FARMHOST_LLM_BASE_URL", "FARMHOST_LLM_MODEL", "FARMHOST_LLM_API_KEY",
        "FARMHOST_AGENT_RUNTIME", "FARMHOST_AGENT_PYTHON", "FARMHOST_ALERT_IGNORE_ENTITIES",
        "FARMHOST_OPENCODE_BIN", "FARMHOST_LLM_2_BASE_URL", "FARMHOST_LLM_2_MODEL", "FARMHOST_LLM_2_API_KEY",
        "FARMHOST_LLM_3_BASE_URL", "FARMHOST_LLM_3_MODEL", "FARMHOST_LLM_3_API_KEY", "FARMHOST_MQTT_URL",
        "FARMHOST_SITE", "FARMHOST_SITES_TRUSTED", "FARMHOST_MQTT_CA_FILE", "FARMHOST_MQTT_CERT_FILE",
        "FARMHOST_MQTT_KEY_FILE", "FARMHOST_DAILY_REPORT", "FARMHOST_QUIET_HOURS", "FARMHOST_STT_MODEL",
        "FARMHOST_STT_URL", "FARMHOST_STT_LANGUAGE",
    }  # fmt: skip
    by_alias = {field.validation_alias: (name, field) for name, field in Settings.model_fields.items()}
    for alias, value in _assignments():
        if alias not in by_alias or alias in examples_not_defaults:
            continue
        name, field = by_alias[alias]
        shown = Settings(_env_file=None, **{alias: value})  # type: ignore[call-arg]
        assert getattr(shown, name) == field.default, f"{alias}={value} is not the default {field.default!r}"
