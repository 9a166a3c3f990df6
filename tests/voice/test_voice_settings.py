"""FARMHOST_STT_*: read and checked once, built into Config.voice; one engine at most."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmhost.config import VoiceSettings, load_config, load_settings
from farmhost.errors import ConfigError


def test_defaults_leave_voice_notes_off(tmp_path: Path) -> None:
    voice = load_config(data_dir=tmp_path, env_file=None).voice
    assert voice == VoiceSettings(
        model=None, url=None, language=None, max_seconds=120.0, idle_seconds=300.0, models_dir=tmp_path / "models"
    )
    assert not voice.enabled


def test_a_wyoming_url_and_its_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARMHOST_STT_URL", " tcp://whisper.farm.lan:10300 ")
    monkeypatch.setenv("FARMHOST_STT_LANGUAGE", "PT")
    monkeypatch.setenv("FARMHOST_STT_MAX_SECONDS", "60")
    monkeypatch.setenv("FARMHOST_STT_IDLE_SECONDS", "0")
    voice = load_config(data_dir=tmp_path, env_file=None).voice
    assert (voice.url, voice.language, voice.max_seconds, voice.idle_seconds) == (
        "tcp://whisper.farm.lan:10300", "pt", 60.0, 0.0
    )  # fmt: skip
    assert voice.enabled and voice.host_port == ("whisper.farm.lan", 10300)


@pytest.mark.parametrize("language", ["auto", "detect", ""])
def test_language_auto_means_detect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, language: str) -> None:
    monkeypatch.setenv("FARMHOST_STT_MODEL", "base")
    monkeypatch.setenv("FARMHOST_STT_LANGUAGE", language)
    assert load_config(data_dir=tmp_path, env_file=None).voice.language is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("FARMHOST_STT_URL", "http://127.0.0.1:10300", "must be tcp://host:port"),
        ("FARMHOST_STT_URL", "tcp://127.0.0.1", "must be tcp://host:port"),
        ("FARMHOST_STT_URL", "tcp://127.0.0.1:70000", "must be tcp://host:port"),
        ("FARMHOST_STT_LANGUAGE", "english", "language code such as en"),
        ("FARMHOST_STT_MAX_SECONDS", "0", "FARMHOST_STT_MAX_SECONDS"),
        ("FARMHOST_STT_IDLE_SECONDS", "-1", "FARMHOST_STT_IDLE_SECONDS"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message) as refused:
        load_settings(data_dir=tmp_path, env_file=None)
    assert str(refused.value).startswith(name) and "\n" not in str(refused.value)


def test_a_model_and_a_url_together_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARMHOST_STT_MODEL", "base")
    monkeypatch.setenv("FARMHOST_STT_URL", "tcp://127.0.0.1:10300")
    with pytest.raises(ConfigError, match="FARMHOST_STT_MODEL and FARMHOST_STT_URL are both set: keep one"):
        load_settings(data_dir=tmp_path, env_file=None)
