"""Helpers of the farmagent tests: a farm (data dir + real daemon), agent environments, AgentInputs, fake IPC dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from farmagent.ipc.client import IpcClient
from farmagent.tools import ToolContext
from farmhost_testing import Daemon, clean_env

MEMORY_TEXT = (
    "# Farm notes\n\nThe north field grows San Marzano tomatoes. Irrigation runs at 06:00 from the well pump.\n"
)


@dataclass
class Farm:
    """A data directory with `main` and `field`, and the real daemon serving it."""

    data_dir: Path
    daemon: Daemon

    def ipc(self, folder: str = "main") -> Path:
        """The group's IPC directory."""
        return self.data_dir / "ipc" / folder

    def workspace(self, folder: str = "main") -> Path:
        """The group's workspace."""
        return self.data_dir / "groups" / folder

    def client(self, folder: str = "main", **options: Any) -> IpcClient:
        """An IpcClient on the group's IPC directory (short default timeout: the daemon answers in ms)."""
        options.setdefault("timeout", 10.0)
        return IpcClient(self.ipc(folder), **options)

    def farm_state(self) -> Path:
        """The host's farm-state directory (empty here: no Home Assistant is configured)."""
        return self.data_dir / "farm-state"

    def context(self, folder: str = "main", **options: Any) -> ToolContext:
        """The ToolContext the runner of `folder` would build (its client, workspace and farm-state)."""
        return ToolContext(
            client=self.client(folder, **options), group_dir=self.workspace(folder), farm_state_dir=self.farm_state()
        )

    def agent_env(self, folder: str = "main", **extra: str) -> dict[str, str]:
        """The environment a sandbox gives the runner / MCP server of `folder` (host paths, process runtime)."""
        env = {k: v for k, v in clean_env().items() if not k.startswith(("FARMAGENT_", "OPENAI_"))}
        env.update(
            FARMAGENT_IPC_DIR=str(self.ipc(folder)),
            FARMAGENT_GROUP_DIR=str(self.workspace(folder)),
            FARMAGENT_GLOBAL_DIR=str(self.workspace("global")),
            FARMAGENT_FARM_STATE_DIR=str(self.farm_state()),
            PYTHONDONTWRITEBYTECODE="1",
        )
        env.update(extra)
        return env

    def quarantine(self, folder: str = "main") -> list[str]:
        """Names in the group's quarantine (empty when the host refused nothing)."""
        errors = self.data_dir / "ipc" / "errors" / folder
        return sorted(os.listdir(errors)) if errors.is_dir() else []


def agent_input(**fields: Any) -> dict[str, Any]:
    """A valid AgentInput for `main`, with `fields` replaced."""
    document: dict[str, Any] = {
        "version": 1,
        "runId": "run-1",
        "groupFolder": "main",
        "isMain": True,
        "prompt": "How are the tomatoes?",
        "scheduled": False,
        "taskId": None,
        "contextMode": "isolated",
        "timezone": "Europe/Amsterdam",
        "now": "2026-07-01T04:30:00Z",
        "chatJid": "telegram:100",
        "memory": [],
        "maxTurns": 6,
        "model": "farm-model",
    }
    document.update(fields)
    return document


def run_agent(
    stdin: str | bytes | dict[str, Any], env: dict[str, str], timeout: float = 30
) -> tuple[int, dict[str, Any], str]:
    """`python -m farmagent.run` with `stdin`; returns (exit code, the AgentResult of the last stdout line, stderr)."""
    data = json.dumps(stdin) if isinstance(stdin, dict) else stdin
    done = subprocess.run(
        [sys.executable, "-m", "farmagent.run"],
        input=data.encode() if isinstance(data, str) else data,
        capture_output=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    stdout = done.stdout.decode()
    lines = stdout.splitlines()
    assert len(lines) == 1, f"stdout must be exactly one line, got {stdout!r}; stderr:\n{done.stderr.decode()}"
    return done.returncode, json.loads(lines[0]), done.stderr.decode()


def offline_context(root: Path, *, status: str = "alive", timeout: float = 1.0) -> ToolContext:
    """A ToolContext under `root` with no daemon behind it: a fake IPC dir, an empty workspace and farm-state."""
    for name in ("group", "farm-state"):
        (root / name).mkdir(parents=True, exist_ok=True)
    client = IpcClient(fake_ipc_dir(root / "ipc", status=status), timeout=timeout)
    return ToolContext(client=client, group_dir=root / "group", farm_state_dir=root / "farm-state")


def fake_ipc_dir(root: Path, *, status: str = "alive", heartbeat_age: float = 0.0) -> Path:
    """A group IPC directory with no daemon behind it, only a host_status.json of the given status and age."""
    for name in ("messages", "tasks", "actions", "action_results"):
        (root / name).mkdir(parents=True, exist_ok=True)
    write_status(root, status=status, heartbeat_age=heartbeat_age)
    return root


def write_status(root: Path, *, status: str, heartbeat_age: float = 0.0) -> None:
    """(Re)write host_status.json the way the host does (temp + rename)."""
    beat = datetime.now(UTC) - timedelta(seconds=heartbeat_age)
    document = {
        "status": status,
        "pid": 1,
        "version": "0.1.0",
        "startedAt": "2026-01-01T00:00:00.000Z",
        "heartbeatAt": beat.strftime("%Y-%m-%dT%H:%M:%S.") + f"{beat.microsecond // 1000:03d}Z",
    }
    tmp = root / ".host_status.json.tmp"
    tmp.write_text(json.dumps(document))
    os.rename(tmp, root / "host_status.json")


def pending(root: Path) -> list[str]:
    """Every request file (final or temporary) in the three queues of an IPC dir."""
    return sorted(f"{q}/{n}" for q in ("messages", "tasks", "actions") for n in os.listdir(root / q))
