"""The settings built into sections: the contract's variables mean the same, looked up once, each service its own."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from datetime import time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from farmhost_testing import clean_env, scaled

from farmhost.broker import site_name
from farmhost.config import Config, LlmEndpoint, QuietHours, Settings, build_config, load_settings
from farmhost.errors import ConfigError


def config(tmp_path: Path, **values: Any) -> Config:
    return build_config(Settings(_env_file=None, FARMHOST_DATA_DIR=tmp_path, **values))  # type: ignore[call-arg]


def test_the_llm_chain_is_a_list_in_the_order_of_the_variables(tmp_path: Path) -> None:
    built = config(
        tmp_path,
        FARMHOST_LLM_BASE_URL="https://api.example.com/v1/",
        FARMHOST_LLM_MODEL="big",
        FARMHOST_LLM_API_KEY="sk-one",
        FARMHOST_LLM_2_BASE_URL="http://192.168.1.20:11434/v1",
        FARMHOST_LLM_2_MODEL="qwen2.5:7b",
        FARMHOST_LLM_3_BASE_URL="http://127.0.0.1:8080/v1",
        FARMHOST_LLM_3_MODEL="smollm2",
        FARMHOST_LLM_3_API_KEY="sk-three",
    )
    llm = built.agents.llm
    assert llm.endpoints == (
        LlmEndpoint(1, "https://api.example.com/v1", "big", "sk-one"),
        LlmEndpoint(2, "http://192.168.1.20:11434/v1", "qwen2.5:7b", None),
        LlmEndpoint(3, "http://127.0.0.1:8080/v1", "smollm2", "sk-three"),
    )
    assert llm.enabled and llm.model == "big"
    assert [e.env_prefix for e in llm.endpoints] == ["FARMHOST_LLM", "FARMHOST_LLM_2", "FARMHOST_LLM_3"]
    # every key stays out of the sandboxes and the logs, the fallbacks' too
    assert {"sk-one", "sk-three"} <= set(built.secrets) and built.agents.secrets == built.secrets
    assert "sk-" not in repr(built)
    assert config(tmp_path).agents.llm.endpoints == () and not config(tmp_path).agents.llm.enabled


def test_every_token_key_and_password_is_one_list_the_logs_and_the_sandboxes_keep_out(tmp_path: Path) -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        FARMHOST_DATA_DIR=tmp_path,
        HA_TOKEN="ha-long-lived",
        TELEGRAM_BOT_TOKEN="1:telegram",
        FARMHOST_LLM_BASE_URL="http://a/v1",
        FARMHOST_LLM_MODEL="m",
        FARMHOST_LLM_2_BASE_URL="http://b/v1",
        FARMHOST_LLM_2_MODEL="n",
        FARMHOST_LLM_2_API_KEY="sk-second",
        FARMHOST_MQTT_URL="mqtt://farm:broker-pass@broker.lan",
    )
    wanted = {"ha-long-lived", "1:telegram", "sk-second", "broker-pass"}  # the fallback's key, the broker's password
    assert set(settings.secret_values()) == wanted
    built = build_config(settings)
    assert set(built.secrets) == wanted and built.agents.secrets == built.secrets


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FARMHOST_LLM_2_BASE_URL": "http://b/v1", "FARMHOST_LLM_2_MODEL": "m"}, "tried after FARMHOST_LLM_BASE_URL"),
        ({"FARMHOST_LLM_BASE_URL": "http://a/v1", "FARMHOST_LLM_MODEL": "m", "FARMHOST_LLM_2_MODEL": "n"},
         "endpoint 2 needs FARMHOST_LLM_2_BASE_URL"),
        ({"FARMHOST_LLM_BASE_URL": "http://a/v1", "FARMHOST_LLM_MODEL": "m", "FARMHOST_LLM_3_BASE_URL": "http://c/v1",
          "FARMHOST_LLM_3_MODEL": "o"}, "tried after FARMHOST_LLM_2_BASE_URL"),
        ({"FARMHOST_LLM_BASE_URL": "http://a/v1", "FARMHOST_LLM_MODEL": "m", "FARMHOST_LLM_2_VISION": "1"},
         "endpoint 2 needs FARMHOST_LLM_2_BASE_URL"),
    ],
)  # fmt: skip
def test_a_fallback_out_of_order_is_still_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        load_settings(data_dir=tmp_path, env_file=None)


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "greater than or equal to 0.01"), ("301", "less than or equal to 300"), ("soon", "valid number")],
)
def test_a_retry_wait_out_of_range_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    """0 s would retry a failing Telegram in a tight loop; the error names the variable and what it got."""
    monkeypatch.setenv("FARMHOST_OUTBOX_RETRY_SECONDS", value)
    with pytest.raises(ConfigError, match=f"FARMHOST_OUTBOX_RETRY_SECONDS: .*{message}.*got '{value}'"):
        load_settings(data_dir=tmp_path, env_file=None)


def test_vision_is_each_endpoints_own_and_off_by_default(tmp_path: Path) -> None:
    chain = {
        "FARMHOST_LLM_BASE_URL": "https://api.example.com/v1",
        "FARMHOST_LLM_MODEL": "big",
        "FARMHOST_LLM_2_BASE_URL": "http://192.168.1.20:11434/v1",
        "FARMHOST_LLM_2_MODEL": "qwen2.5:7b",
    }
    plain = config(tmp_path, **chain).agents.llm
    assert [e.vision for e in plain.endpoints] == [False, False] and not plain.vision
    seeing = config(tmp_path, **chain, FARMHOST_LLM_VISION="1").agents.llm
    assert [e.vision for e in seeing.endpoints] == [True, False] and seeing.vision
    second = config(tmp_path, **chain, FARMHOST_LLM_2_VISION="true").agents.llm
    assert [e.vision for e in second.endpoints] == [False, True] and second.vision


def test_what_the_host_decides_is_looked_up_once_and_shared(tmp_path: Path) -> None:
    built = config(tmp_path, TZ="Europe/Lisbon", FARMHOST_AGENT_RUNTIME="process")
    assert built.zone == ZoneInfo("Europe/Lisbon") and built.tz == "Europe/Lisbon"
    zones = [built.scheduler.zone, built.telegram.zone, built.agents.zone, built.agents.llm.zone, built.farm.zone,
             built.farm.state.zone, built.alerts.zone, built.report.zone, built.site.zone]  # fmt: skip
    assert all(zone is built.zone for zone in zones)
    assert built.agents.sandbox.runtime == "process"
    unnamed = config(tmp_path)
    assert unnamed.site.name == site_name(socket.gethostname()) == unnamed.ipc.site
    assert config(tmp_path, FARMHOST_SITE="pump-house").site.name == "pump-house"


def test_the_sections_are_frozen_and_the_parser_computes_nothing(tmp_path: Path) -> None:
    built = config(tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.ipc.mode = "poll"  # type: ignore[misc]
    derived = [name for name, value in vars(Settings).items() if isinstance(value, property)]
    assert derived == []


def test_each_section_carries_the_variables_of_its_service(tmp_path: Path) -> None:
    built = config(
        tmp_path,
        FARMHOST_IPC_MODE="poll",
        FARMHOST_IPC_POLL_SECONDS="0.1",
        FARMHOST_TASK_GRACE_SECONDS="60",
        FARMHOST_TASKS_PER_GROUP="7",
        FARMHOST_OUTBOX_GROUP_MAX_BYTES="1000",
        FARMHOST_OUTBOX_MAX_ATTEMPTS="3",
        FARMHOST_OUTBOX_RETRY_SECONDS="0.25",
        TELEGRAM_BOT_TOKEN="1:abc",
        FARMHOST_AGENT_KIND="command",
        FARMHOST_AGENT_COMMAND="/workspace/group/agent --fast 'two words'",
        FARMHOST_AGENT_MEMORY_MB="512",
        FARM_MODE="production",
        FARMHOST_DASHBOARD_BACKUPS="4",
        FARMHOST_ALERT_FLAP_MINUTES="2",
        FARMHOST_QUIET_HOURS="22-06",
        FARMHOST_DAILY_REPORT="7:05",
        FARMHOST_MQTT_URL="mqtt://farm:secret@broker.lan",
        FARMHOST_SITES_TRUSTED="barn, pump-house",
        FARMHOST_SITE="barn",
        FARMHOST_SITE_RESEND_SECONDS="2",
        FARMHOST_SITE_ANSWER_GRACE_SECONDS="0.5",
    )
    assert (built.ipc.mode, built.ipc.poll_seconds) == ("poll", 0.1)
    assert (built.scheduler.grace_seconds, built.scheduler.tasks_per_group_max) == (60, 7)
    assert built.outbox.group_max_bytes == 1000 and built.telegram.outbox_max_attempts == 3
    assert built.telegram.outbox_retry_seconds == 0.25
    assert built.telegram.enabled and "1:abc" not in repr(built.telegram)
    assert built.agents.command == ("/workspace/group/agent", "--fast", "two words")
    assert built.agents.limits.memory_mb == 512
    assert (built.farm.mode, built.farm.state.farm_mode, built.farm.dashboard_backups) == ("production",) * 2 + (4,)
    assert built.farm.profile_path == tmp_path / "farm-profile.json" == built.report.profile_path
    assert built.alerts.flap == timedelta(minutes=2) and built.alerts.quiet == QuietHours(start=22, end=6)
    assert built.report.at == time(7, 5)
    assert built.site.broker is not None and built.site.broker.host == "broker.lan"
    assert built.site.trusted == frozenset({"pump-house"})  # never itself
    assert (built.site.resend_seconds, built.site.answer_grace_seconds) == (2, 0.5)
    assert config(tmp_path).site.answer_grace_seconds == 5  # the default


@pytest.mark.parametrize(
    "content",
    ["# Configuração da quinta\nHA_URL=http://ha:8123\n".encode("latin-1"), "HA_URL=http://ha:8123\n".encode("utf-16")],
)
def test_an_env_file_that_is_not_utf8_is_refused_in_one_line_naming_it(tmp_path: Path, content: bytes) -> None:
    """A `.env` saved by an editor as "ANSI" or "Unicode" stopped every command with a UnicodeDecodeError traceback."""
    (tmp_path / ".env").write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "farmhost", "group", "list", "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=False, timeout=scaled(60),
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"farmhost: error: {tmp_path / '.env'} is not UTF-8 text"), done.stderr
    assert "save it as UTF-8" in done.stderr and len(done.stderr.splitlines()) == 1
