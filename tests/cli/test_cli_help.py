"""`farmhost ... --help` exits 0 and explains every command."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from farmhost_testing import clean_env, farmhost

# command -> phrases its help must contain (whitespace-normalised, so line wrapping does not matter).
HELP: dict[tuple[str, ...], tuple[str, ...]] = {
    (): ("init", "run", "doctor", "group", "task", "outbox", "schema", "ipc", "FARMHOST_DATA_DIR", ".env"),
    ("init",): ("data directory", "farmhost.db", "--data-dir"),
    ("run",): ("daemon", "SIGTERM", "SIGINT", "stopped", "Only one daemon", "--verbose", "--log-format", "json"),
    ("doctor",): ("ok, warn, off or broken", "Home Assistant", "Telegram", "disk", "clock", "--json", "Exit status 1"),
    ("schema",): ("JSON Schema", "docs/schema/ipc-v1.schema.json", "--output"),
    ("group",): ("add", "list", "remove"),
    ("group", "add"): ("--jid", "--name", "--folder", "--main", "--trigger", "'global'", "only one", "main"),
    ("group", "list"): ("registered groups", "--json"),
    ("group", "remove"): ("files are kept", "folder"),
    ("task",): ("list",),
    ("task", "list"): ("scheduled tasks", "--json", "--all"),
    ("outbox",): ("list",),
    ("outbox", "list"): ("outbox", "--json", "--status", "pending", "sent", "failed"),
    ("ipc",): ("send", "agent"),
    ("ipc", "send"): ("--group", "--queue", "--json", "--file", "stdin", "--timeout", "Exit status", "0", "1", "2"),
}
# Every command that works on a data directory says how to choose it.
TAKES_DATA_DIR = [cmd for cmd in HELP if len(cmd) == 2 or cmd in {("init",), ("run",), ("doctor",), ("schema",)}]


def test_every_command_explains_itself(tmp_path: Path) -> None:
    env = clean_env(COLUMNS="100")
    data = tmp_path / "data"
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = dict(
            zip(HELP, pool.map(lambda cmd: farmhost(*cmd, "--help", data_dir=data, env=env), HELP), strict=True)
        )
    for cmd, phrases in HELP.items():
        proc = done[cmd]
        name = " ".join(("farmhost", *cmd))
        assert proc.returncode == 0, f"{name} --help: {proc.stderr}"
        assert proc.stderr == ""
        text = " ".join(proc.stdout.split())
        assert text.startswith(f"usage: {name}"), text
        for phrase in phrases:
            assert phrase in text, f"{name} --help does not mention {phrase!r}:\n{proc.stdout}"
        if cmd:  # the top-level help lists commands; each command has its own sentence
            assert len(text.split("options:")[0]) > len(f"usage: {name} [-h]") + 20, f"{name} --help has no description"
        if cmd in TAKES_DATA_DIR:
            assert "--data-dir" in text and "FARMHOST_DATA_DIR" in text, name
    assert not data.exists(), "--help must not create the data directory"


def test_version_and_missing_command(tmp_path: Path) -> None:
    version = farmhost("--version", data_dir=tmp_path / "data")
    assert version.returncode == 0
    assert version.stdout.startswith("farmhost ")
    bare = farmhost("group", data_dir=tmp_path / "data")
    assert bare.returncode == 2
    assert "add" in bare.stderr and "Traceback" not in bare.stderr
