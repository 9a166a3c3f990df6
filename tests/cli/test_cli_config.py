"""Configuration precedence (--data-dir > environment > .env > default) and one-line errors for bad values."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from farmhost_testing import clean_env, farmhost


def _raw(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m farmhost` exactly as given: no --data-dir added."""
    return subprocess.run(
        [sys.executable, "-m", "farmhost", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def _doctor(data_dir: Path, **env: str) -> dict[str, dict[str, str]]:
    done = farmhost("doctor", "--json", data_dir=data_dir, env=clean_env(**env))
    assert done.stdout, done.stderr
    return {check["part"]: check for check in json.loads(done.stdout)}


def test_data_dir_option_beats_the_environment_which_beats_the_default(tmp_path: Path) -> None:
    option, from_env = tmp_path / "option", tmp_path / "from-env"
    env = clean_env(FARMHOST_DATA_DIR=str(from_env))
    done = farmhost("init", data_dir=option, env=env)
    assert done.returncode == 0, done.stderr
    assert (option / "farmhost.db").is_file()
    assert not from_env.exists()
    # Without the option the variable decides; without either, ./data in the current directory.
    assert _raw("init", cwd=tmp_path, env=env).returncode == 0
    assert (from_env / "farmhost.db").is_file()
    assert not (tmp_path / "data").exists()
    assert _raw("init", cwd=tmp_path, env=clean_env()).returncode == 0
    assert (tmp_path / "data" / "farmhost.db").is_file()
    # The option may also come before the command name.
    before = _raw("--data-dir", str(option), "group", "list", "--json", cwd=tmp_path, env=env)
    assert before.returncode == 0 and json.loads(before.stdout) == [], before.stderr
    # A .env value for FARMHOST_DATA_DIR loses to the option too.
    (tmp_path / ".env").write_text(f"FARMHOST_DATA_DIR={tmp_path / 'dotenv'}\n")
    listed = farmhost("group", "list", "--json", data_dir=option)
    assert listed.returncode == 0, listed.stderr
    assert not (tmp_path / "dotenv").exists()


def test_dotenv_in_the_current_directory_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (tmp_path / ".env").write_text("# farm settings\nTZ=Europe/Lisbon\nFARMHOST_IPC_MODE=poll\n")
    checks = _doctor(data)
    assert checks["timezone"]["detail"].startswith("Europe/Lisbon")
    assert checks["inotify"]["state"] == "off" and "poll" in checks["inotify"]["detail"]
    overridden = _doctor(data, TZ="Asia/Tokyo")
    assert overridden["timezone"]["detail"].startswith("Asia/Tokyo")
    assert overridden["inotify"]["state"] == "off"


BAD = [
    ("FARMHOST_MAX_AGENTS", "abc"),
    ("TZ", "Mars/Base"),
    ("FARMHOST_IPC_MODE", "fast"),
    ("HA_URL", "ftp://x"),
]


def _one_line_error(done: subprocess.CompletedProcess[str], variable: str, value: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"farmhost: error: {variable}:"), lines[0]
    assert lines[0].count(repr(value)) == 1, lines[0]  # the offending value, once


def test_a_bad_value_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = list(pool.map(lambda bad: farmhost("init", data_dir=data, env=clean_env(**dict([bad]))), BAD))
    for (variable, value), done in zip(BAD, runs, strict=True):
        _one_line_error(done, variable, value)
    assert not data.exists(), "a command with a bad configuration must do nothing"
    # The same from .env, for a command that needs no data directory.
    (tmp_path / ".env").write_text("TZ=Mars/Base\n")
    _one_line_error(farmhost("schema", data_dir=data), "TZ", "Mars/Base")


def test_commands_that_read_refuse_a_data_dir_without_database(tmp_path: Path) -> None:
    typo = tmp_path / "dta"
    typo.mkdir()
    commands = [
        ("group", "list"),
        ("outbox", "list", "--json"),
        ("ipc", "send", "--group=main", "--queue=actions", '--json={"type": "ping"}', "--timeout=0.2"),
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = list(pool.map(lambda cmd: farmhost(*cmd, data_dir=typo), commands))
    for cmd, done in zip(commands, runs, strict=True):
        assert done.returncode == 2, (cmd, done.stderr)
        assert done.stderr.strip() == (
            f"farmhost: error: no farmhost database in {typo}; create it with `farmhost init --data-dir {typo}`"
        ), cmd
    assert list(typo.iterdir()) == [], "nothing may be created in a directory that is not a data dir"


def test_fallback_llm_endpoints_must_be_complete_and_in_order(tmp_path: Path) -> None:
    first = {"FARMHOST_LLM_BASE_URL": "http://127.0.0.1:1/v1", "FARMHOST_LLM_MODEL": "m"}
    cases = [
        ({**first, "FARMHOST_LLM_2_BASE_URL": "http://127.0.0.1:2/v1"}, "needs FARMHOST_LLM_2_MODEL too"),
        ({**first, "FARMHOST_LLM_2_MODEL": "q"}, "needs FARMHOST_LLM_2_BASE_URL too"),
        ({"FARMHOST_LLM_2_BASE_URL": "http://127.0.0.1:2/v1", "FARMHOST_LLM_2_MODEL": "q"},
         "FARMHOST_LLM_2_BASE_URL is a fallback tried after FARMHOST_LLM_BASE_URL and FARMHOST_LLM_MODEL"),
        ({**first, "FARMHOST_LLM_3_BASE_URL": "http://127.0.0.1:3/v1", "FARMHOST_LLM_3_MODEL": "q"},
         "tried after FARMHOST_LLM_2_BASE_URL and FARMHOST_LLM_2_MODEL, which are not set"),
        ({**first, "FARMHOST_LLM_2_BASE_URL": "ftp://x", "FARMHOST_LLM_2_MODEL": "q"}, "FARMHOST_LLM_2_BASE_URL"),
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        runs = list(pool.map(lambda case: farmhost("init", data_dir=tmp_path / "d", env=clean_env(**case[0])), cases))
    for (_, words), done in zip(cases, runs, strict=True):
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


# Every setting set to the empty string, as `FOO=` in a shell, a compose file or .env writes it.
EMPTY = [
    "FARMHOST_DATA_DIR",
    "FARMHOST_IPC_MODE",
    "FARM_MODE",
    "FARMHOST_MAX_AGENTS",
    "FARMHOST_AGENT_RUNTIME",
    "FARMHOST_AGENT_KIND",
    "FARMHOST_LLM_VISION",
    "TZ",
    "HA_URL",
    "FARMHOST_QUIET_HOURS",
]


def test_an_empty_value_is_the_same_as_unset(tmp_path: Path) -> None:
    env = clean_env(**dict.fromkeys(EMPTY, ""))
    made = _raw("init", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "data" / "farmhost.db").is_file(), "the default ./data, not the current directory"
    assert not (tmp_path / "farmhost.db").exists()
    listed = _raw("group", "list", "--json", cwd=tmp_path, env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    # The defaults of the contract's table, as `doctor` reports them.
    checks = _doctor(tmp_path / "data", **dict.fromkeys(EMPTY, ""))
    assert "poll" not in checks["inotify"]["detail"]
    assert checks["home assistant"]["state"] == "off"
    # The same empty values from .env.
    (tmp_path / ".env").write_text("".join(f"{name}=\n" for name in EMPTY))
    again = _raw("group", "list", "--json", cwd=tmp_path, env=clean_env())
    assert again.returncode == 0 and json.loads(again.stdout) == [], again.stderr
