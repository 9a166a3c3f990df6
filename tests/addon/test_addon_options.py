"""The add-on's options file as the Supervisor writes it: good values taken, each bad one named once, secrets hidden."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from farmhost_testing import clean_env

from farmhost.addon.options import AddonOptions, read_options
from farmhost.addon.run import addon_environment


def write(tmp_path: Path, options: object) -> Path:
    path = tmp_path / "options.json"
    path.write_text(json.dumps(options))
    return path


def test_a_complete_options_file_is_taken_as_it_is(tmp_path: Path) -> None:
    given = {
        "telegram_bot_token": "123:abc", "main_chat_id": -1001234, "main_chat_name": "Office",
        "llm_base_url": "http://192.168.1.20:11434/v1/", "llm_model": "qwen2.5:7b", "llm_api_key": "sk-1",
        "farm_mode": "production", "farm_profile": "farm-profile.json", "log_level": "DEBUG",
    }  # fmt: skip
    options, problems = read_options(write(tmp_path, given))
    assert problems == []
    assert options.main_chat_id == -1001234 and options.farm_mode == "production"
    assert options.llm_base_url == "http://192.168.1.20:11434/v1"  # no trailing slash, as the LLM settings want it
    assert "123:abc" not in repr(options) and "sk-1" not in repr(options)


def test_each_missing_or_wrong_option_gets_one_line_and_the_rest_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    given = {
        "telegram_bot_token": 12345, "main_chat_id": "office", "llm_base_url": "ftp://llm", "llm_model": "m",
        "farm_mode": "real", "farm_profile": "../../etc/passwd", "log_level": "INFO", "main_chat_name": "",
    }  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="farmhost.addon.options"):
        options, problems = read_options(write(tmp_path, given))
    named = sorted(line.split(":")[0] for line in problems)
    assert named == [
        "option farm_mode", "option farm_profile", "option llm_base_url", "option main_chat_id",
        "option telegram_bot_token",
    ], problems  # fmt: skip
    assert [r.getMessage() for r in caplog.records] == problems
    assert options.llm_model == "m" and options.farm_mode == "demo" and options.main_chat_id is None
    assert options.farm_profile is None and options.main_chat_name == "Farm office"  # an empty one is no value
    assert not any("12345" in line for line in problems), problems  # a secret's value is never logged
    assert any("got 'ftp://llm'" in line for line in problems), problems


def test_missing_parts_say_what_stays_off(tmp_path: Path) -> None:
    _, problems = read_options(write(tmp_path, {"farm_mode": "demo"}))
    assert problems == [
        "option telegram_bot_token is missing: farmhost does not talk to Telegram until it is set (BotFather gives one)",
        "option main_chat_id is missing: no main chat is registered, so nobody can talk to farmhost until it is set",
        "option llm_base_url is missing: agents do not run; chat messages are answered by Home Assistant's Assist",
        "option llm_model is missing: agents do not run; chat messages are answered by Home Assistant's Assist",
    ]


@pytest.mark.parametrize(("content", "said"), [("{not json", "cannot be read"), ("[1, 2]", "holds list")])
def test_an_unreadable_file_gives_the_defaults_and_says_why(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "options.json"
    path.write_text(content)
    options, problems = read_options(path)
    assert options == AddonOptions() and said in problems[0], problems
    _, missing = read_options(tmp_path / "absent.json")
    assert "cannot be read" in missing[0]


def test_a_value_with_a_control_character_is_named_and_spaces_around_a_value_are_dropped(tmp_path: Path) -> None:
    # JSON carries "\u0000" as well as any character: a NUL in the environment stopped addon-run with a traceback.
    given = {
        "telegram_bot_token": " 123:abc\n", "llm_base_url": "http://llm:11434/v1 ", "llm_model": "qwen\u0000",
        "llm_api_key": "sk-1\nX-Injected: 1", "main_chat_name": "Office\r\n", "main_chat_id": -1001,
    }  # fmt: skip
    options, problems = read_options(write(tmp_path, given))
    assert sorted(line.split(":")[0] for line in problems) == ["option llm_api_key", "option llm_model"], problems
    assert all("one line of text" in line for line in problems) and not any("sk-1" in p for p in problems)
    assert options.telegram_bot_token == "123:abc" and options.llm_base_url == "http://llm:11434/v1"
    assert options.main_chat_name == "Office" and options.llm_model is None and options.llm_api_key is None
    env = addon_environment(options, None, clean_env())
    assert subprocess.run([sys.executable, "-c", "pass"], env=env, check=False).returncode == 0
